"""A seeded, stratified train / held-out split (NumPy only)."""

import numpy as np


def stratified_split(labels, *, test_fraction=0.2, seed=0):
    """Splits example indices per class into train and test.

    Each class contributes ``round(test_fraction * count)`` examples to the test split,
    chosen by NumPy's legacy `RandomState`, whose stream NumPy keeps frozen across
    releases, so the split is the same on every machine and version.

    Args:
        labels: 1-D array of class ids.
        test_fraction: float in (0, 1), the held-out share of every class.
        seed: int, the split's seed.

    Returns:
        ``(train_indices, test_indices)``, both sorted int64 arrays.

    Raises:
        ValueError: for a `test_fraction` outside (0, 1).

    Example:
        >>> train, test = stratified_split(np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1]))
        >>> len(train), len(test)
        (8, 2)
    """
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(
            f"`test_fraction` must be in (0, 1). Received: test_fraction={test_fraction!r}"
        )
    labels = np.asarray(labels)
    rng = np.random.RandomState(seed)
    train, test = [], []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        members = members[rng.permutation(len(members))]
        n_test = int(round(test_fraction * len(members)))
        test.append(members[:n_test])
        train.append(members[n_test:])
    return (
        np.sort(np.concatenate(train)).astype(np.int64),
        np.sort(np.concatenate(test)).astype(np.int64),
    )
