"""`keras-preact weights list|fetch|verify|path|clear|preset|convert|readme` over
`keras_preact.weights`."""

import os
import sys

from keras_preact.cli.common import EXIT_PARTIAL, partial_status, print_error, print_table


def add_commands(subparsers):
    p = subparsers.add_parser(
        "weights", help="pretrained weights: list the catalog, fetch, verify, locate, clear cache",
        description="The pretrained-weights catalog and its verified cache (default "
        "~/.keras/keras_preact/weights, or $KERAS_PREACT_HOME/weights). Offline mode: "
        "KERAS_PREACT_OFFLINE=1 resolves only from $KERAS_PREACT_WEIGHTS_DIR and the cache.")
    sub = p.add_subparsers(dest="weights_command", required=True)

    def command(name, func, help):
        q = sub.add_parser(name, help=help)
        q.set_defaults(func=func)
        return q

    q = command("list", cmd_list, "the catalog's weights (and which are cached)")
    q.add_argument("--model", help="only this model's weights")
    q = command("fetch", cmd_fetch, "download, verify, convert and cache weights")
    q.add_argument("keys", nargs="+", help="catalog keys, e.g. preact_resnet110.cifar10")
    q.add_argument("--offline", action="store_true", help="only from $KERAS_PREACT_WEIGHTS_DIR")
    q.add_argument("--no-progress", action="store_true", help="no download progress bar")
    q = command("verify", cmd_verify, "check cached files against their recorded SHA-256")
    q.add_argument("keys", nargs="*", help="catalog keys (default: every cached file)")
    q = command("path", cmd_path, "where a key's weights are (or would be) cached")
    q.add_argument("key", nargs="?", default=None, help="a catalog key (default: the cache folder)")
    q = command("clear", cmd_clear, "delete cached weights (all, or the given keys)")
    q.add_argument("keys", nargs="*", help="catalog keys (default: the whole cache)")
    for q in sub.choices.values():
        q.add_argument("--cache-dir", default=None, help="the cache folder")
    q = command("preset", cmd_preset, "write catalog weights as a keras-hub preset folder")
    q.add_argument("key", help="a catalog key, e.g. preact_resnet110.cifar10")
    q.add_argument("out", help="the preset folder (keras_hub.models.ImageClassifier.from_preset "
                   "loads it)")
    q.add_argument("--overwrite", action="store_true", help="replace the preset the folder holds")
    q = command("convert", cmd_convert, "a checkpoint of your own (pytorchcv .pth) as .weights.h5")
    q.add_argument("source", help="the checkpoint, e.g. model.pth (read without PyTorch)")
    q.add_argument("--model", required=True, help="the keras-preact model, e.g. preact_resnet20")
    q.add_argument("--converter", default="pytorchcv", help="its layout (default: pytorchcv)")
    q.add_argument("--classes", type=int, help="its head's classes (default: the catalog's)")
    q.add_argument("--out", required=True, help="the .weights.h5 file to write")
    q.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    q = command("readme", cmd_readme, "render the zoo table (zoo/README.md) from the manifests")
    q.add_argument("--output", default=None, help="write to this file (default: print)")


def _cell(value):
    return "-" if value is None else str(value)


def cmd_list(args):
    from keras_preact.weights import cached_entries, list_entries
    if args.model is not None:
        from keras_preact.models.registry import model_info
        model_info(args.model)  # an unknown name is an error, not an empty list
    if not (entries := list_entries(args.model)):
        print(f"No pretrained weights in the catalog{f' for {args.model}' if args.model else ''}.")
        return 0
    cached = {c["key"] for c in cached_entries(args.cache_dir)}
    rows = [(e.key, "yes" if e.default else "", _cell(e.dataset), _cell(e.classes),
             _cell(e.metrics.top1_error), "yes" if e.key in cached else "") for e in entries]
    print_table(("weights", "default", "dataset", "classes", "error %", "cached"), rows)
    return 0


def cmd_fetch(args):
    from keras_preact.models import get_model
    from keras_preact.weights.download import fetch_weights
    failed = 0
    for key in args.keys:
        try:
            path = fetch_weights(key, build=get_model, cache_dir=args.cache_dir,
                                 offline=args.offline or None, progress=not args.no_progress)
        except (ValueError, OSError) as err:  # the other keys are still fetched
            print_error(err)
            failed += 1
        else:
            print(f"{key}: {path}")
    return partial_status(failed, len(args.keys))


#: What `weights verify` prints for each status of `verify_cache`.
_VERIFY_LINES = {"ok": "{key}: ok (sha256 {sha256})", "not cached": "{key}: not cached",
                 "no record": "{key}: NO RECORD (no sidecar {path}.json; not trusted)",
                 "altered": "{key}: ALTERED ({error})"}


def cmd_verify(args):
    from keras_preact.weights.download import verify_cache
    if not (rows := verify_cache(args.keys, args.cache_dir)):
        print("The cache holds no weights.")
    for row in rows:
        print(_VERIFY_LINES[row["status"]].format(**row))
    return 0 if all(row["status"] == "ok" for row in rows) else EXIT_PARTIAL


def cmd_path(args):
    from keras_preact.weights import download, get_entry
    if args.key is None:
        print(download.resolve_cache_dir(args.cache_dir))
        return 0
    path = download.cached_paths(get_entry(args.key), args.cache_dir)[0]
    print(path)
    if os.path.isfile(path):
        return 0
    print(f"{args.key} is not cached yet: `keras-preact weights fetch {args.key}` puts it "
          "there.", file=sys.stderr)
    return EXIT_PARTIAL


def cmd_clear(args):
    from keras_preact.weights.download import cached_entries, clear_cache
    removed = [path for key in args.keys or [None] for path in clear_cache(key, args.cache_dir)]
    kept = [e["path"] for e in cached_entries(args.cache_dir)
            if not args.keys or e["key"] in args.keys]
    print(f"Removed {len(removed)} file(s).")
    if kept:
        print(f"Kept {len(kept)} file(s) the cache did not write or that changed since (no "
              f"record of their SHA-256): {', '.join(kept)}")
    return 0


def cmd_preset(args):
    from keras_preact.hub import save_preset
    from keras_preact.models import get_model
    from keras_preact.weights.catalog import get_entry
    entry = get_entry(args.key)
    include_top = entry.architecture.get("include_top") is not False
    model = get_model(entry.model, weights=entry.tag, include_top=include_top)
    path = save_preset(model, args.out, overwrite=args.overwrite)
    print(f"{args.key}: {path} (keras-hub {'ImageClassifier' if include_top else 'Backbone'} "
          "preset)")
    return 0


def cmd_convert(args):
    from keras_preact.models import get_model
    from keras_preact.weights import convert_checkpoint
    path = convert_checkpoint(args.source, args.out, build=get_model, **{
        name: getattr(args, name) for name in ("model", "converter", "classes", "overwrite")})
    print(f"{args.source}: {path} (weights={path!r} loads it)")
    return 0


def cmd_readme(args):
    from keras_preact.file_io import atomic_write_text
    from keras_preact.weights.catalog import README_HEADER, render_zoo_readme
    if args.output is None:
        sys.stdout.write(render_zoo_readme())
    else:
        if os.path.isfile(args.output):
            with open(args.output, encoding="utf-8", errors="replace") as f:
                if not f.read().startswith(README_HEADER):
                    raise ValueError("The file is not a zoo table (it does not start with its "
                                     "header); it was not changed. Choose another file. "
                                     f"Received: --output={args.output!r}")
        atomic_write_text(args.output, render_zoo_readme())
        print(f"Wrote {args.output}")
    return 0
