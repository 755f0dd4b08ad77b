"""`keras-preact weights list|fetch|verify|path|clear|readme`."""

import os
import sys


def add_commands(subparsers):
    """Adds the ``weights`` command and its subcommands to the `keras-preact` parser."""
    p = subparsers.add_parser(
        "weights",
        help="pretrained weights: list the catalog, fetch, verify, locate, clear the cache",
        description=(
            "The pretrained-weights catalog and its verified cache (default "
            "~/.keras/keras_preact/weights, or $KERAS_PREACT_HOME/weights). Offline "
            "mode: KERAS_PREACT_OFFLINE=1 resolves only from $KERAS_PREACT_WEIGHTS_DIR "
            "and the cache."
        ),
    )
    sub = p.add_subparsers(dest="weights_command", required=True)

    def common(q):
        q.add_argument("--cache-dir", default=None, help="the cache folder")

    q = sub.add_parser("list", help="the catalog's weights (and which are cached)")
    q.add_argument("--model", default=None, help="only this model's weights")
    common(q)
    q.set_defaults(func=cmd_list)

    q = sub.add_parser("fetch", help="download, verify, convert and cache weights")
    q.add_argument("keys", nargs="+", help="catalog keys, e.g. preact_resnet110.cifar10")
    q.add_argument("--offline", action="store_true", help="only from $KERAS_PREACT_WEIGHTS_DIR")
    q.add_argument("--no-progress", action="store_true")
    common(q)
    q.set_defaults(func=cmd_fetch)

    q = sub.add_parser("verify", help="check cached files against their recorded SHA-256")
    q.add_argument("keys", nargs="*", help="catalog keys (default: every cached file)")
    common(q)
    q.set_defaults(func=cmd_verify)

    q = sub.add_parser("path", help="where a key's weights are (or would be) cached")
    q.add_argument("key", nargs="?", default=None, help="a catalog key (default: the cache folder)")
    common(q)
    q.set_defaults(func=cmd_path)

    q = sub.add_parser("clear", help="delete cached weights (all, or the given keys)")
    q.add_argument("keys", nargs="*")
    common(q)
    q.set_defaults(func=cmd_clear)

    q = sub.add_parser("readme", help="render the zoo table (zoo/README.md) from the manifests")
    q.add_argument("--output", default=None, help="write to this file (default: print)")
    q.set_defaults(func=cmd_readme)


def _fail(err):
    print(f"error: {err}", file=sys.stderr)
    return 2


def _cached_keys(cache_dir):
    from keras_preact.weights.download import cached_entries

    return {e["key"]: e for e in cached_entries(cache_dir)}


def cmd_list(args):
    from keras_preact.weights.catalog import list_entries

    try:
        if args.model is not None:
            from keras_preact.models.registry import model_info

            model_info(args.model)
        entries = list_entries(args.model)
        cached = _cached_keys(args.cache_dir)
    except ValueError as err:
        return _fail(err)
    if not entries:
        print("No pretrained weights in the catalog" + (f" for {args.model}." if args.model else "."))
        return 0
    header = ("weights", "default", "dataset", "classes", "error %", "cached")
    rows = [
        (
            e["key"],
            "yes" if e.get("default") else "",
            str(e.get("dataset", "")),
            str(e.get("classes", "")),
            str((e.get("metrics") or {}).get("top1_error", "-")),
            "yes" if e["key"] in cached else "",
        )
        for e in entries
    ]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    return 0


def cmd_fetch(args):
    from keras_preact.weights.download import fetch_weights

    status = 0
    for key in args.keys:
        try:
            path = fetch_weights(
                key, cache_dir=args.cache_dir, offline=True if args.offline else None,
                progress=not args.no_progress,
            )
        except (ValueError, OSError) as err:
            status = _fail(err)
            continue
        print(f"{key}: {path}")
    return status


def cmd_verify(args):
    from keras_preact.weights.catalog import get_entry
    from keras_preact.weights.download import cached_paths
    from keras_preact.weights.download import verify_cached

    cached = _cached_keys(args.cache_dir)
    try:
        keys = args.keys or sorted(cached)
        paths = {}
        for key in keys:
            if key in cached:
                paths[key] = cached[key]["path"]
            else:
                paths[key] = cached_paths(get_entry(key), args.cache_dir)[0]
    except ValueError as err:
        return _fail(err)
    if not keys:
        print("The cache holds no weights.")
        return 0
    status = 0
    for key in keys:
        path = paths[key]
        if not os.path.isfile(path):
            print(f"{key}: not cached")
            status = 1
            continue
        try:
            record = verify_cached(path, path + ".json")
        except FileNotFoundError:
            print(f"{key}: NO RECORD (no sidecar {path}.json; not trusted)")
            status = 1
            continue
        except ValueError as err:
            print(f"{key}: ALTERED ({err})")
            status = 1
            continue
        print(f"{key}: ok (sha256 {record['sha256']})")
    return status


def cmd_path(args):
    from keras_preact.weights.catalog import get_entry
    from keras_preact.weights.download import cached_paths
    from keras_preact.weights.download import resolve_cache_dir

    if args.key is None:
        print(resolve_cache_dir(args.cache_dir))
        return 0
    try:
        path = cached_paths(get_entry(args.key), args.cache_dir)[0]
    except ValueError as err:
        return _fail(err)
    print(path)
    return 0 if os.path.isfile(path) else 1


def cmd_clear(args):
    from keras_preact.weights.download import clear_cache

    removed = []
    for key in args.keys or [None]:
        removed += clear_cache(key, args.cache_dir)
    print(f"Removed {len(removed)} file(s).")
    return 0


def cmd_readme(args):
    from keras_preact.weights.catalog import render_zoo_readme

    try:
        text = render_zoo_readme()
    except ValueError as err:
        return _fail(err)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.output)
    print(f"Wrote {args.output}")
    return 0
