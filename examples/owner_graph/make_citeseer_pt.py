"""Write Planetoid CiteSeer as a graph owner would hold it: a ``torch_geometric.data.Data``
with ``x``, ``y`` and ``edge_index`` only, ``torch.save``d to a ``.pt`` file.

CiteSeer is not bundled with GraphVeil; its raw files are in ``../shared/data/planetoid``.
They are read with PyG's own reader on a temporary copy (PyG's ``Planetoid`` dataset class
would write ``processed/`` next to them and try to download a missing file; this never
downloads). PyG pads the 15 test indices missing from ``ind.citeseer.test.index``'s range with
zero features and class 0; those rows are not papers, so they are written unlabelled (``y = -1``).
No other preprocessing: no masks, no label names, isolated nodes kept (the owner's graph as is).

    python examples/owner_graph/make_citeseer_pt.py \
        --raw /work/shared/data/planetoid/CiteSeer/raw --out citeseer_owner.pt
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.io import read_planetoid_data


def padded_test_rows(raw: Path) -> torch.Tensor:
    """Node indices PyG invents for CiteSeer's gaps in ``test.index`` (as its reader does)."""
    index = np.loadtxt(raw / "ind.citeseer.test.index", dtype=np.int64)
    full = np.arange(index.min(), index.max() + 1)
    return torch.from_numpy(np.setdiff1d(full, index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw", type=Path, default=Path("/work/shared/data/planetoid/CiteSeer/raw"))
    parser.add_argument("--out", type=Path, default=Path("citeseer_owner.pt"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="citeseer-raw-") as tmp:
        for f in args.raw.glob("ind.citeseer.*"):
            shutil.copy(f, tmp)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # scipy.sparse pickles
            pyg = read_planetoid_data(tmp, "CiteSeer")
    y = pyg.y.clone()
    y[padded_test_rows(args.raw)] = -1
    data = Data(x=pyg.x, y=y, edge_index=pyg.edge_index)
    torch.save(data, args.out)
    deg = torch.bincount(data.edge_index[0], minlength=data.num_nodes)
    print(f"{args.out}: {data.num_nodes} nodes, {data.x.shape[1]} features, "
          f"{data.edge_index.shape[1]} directed entries, max degree {int(deg.max())}, "
          f"{int((y >= 0).sum())} labelled, {int(y.max()) + 1} classes")


if __name__ == "__main__":
    main()
