"""Run inside a venv that holds one framework extra (``torch`` or ``lightning``) alone:
``python framework_child.py EXTRA WORKDIR``. Exits 0 and prints ``framework_child: ok`` when

- ``import commitstore``, ``open_store`` and a commit import none of torch, lightning, transformers;
- the libraries of every other extra are missing (backends, transformers; for ``torch``, lightning);
- ``commitstore.torch`` saves, loads (verified, read once) and maps a fetched copy;
- for ``lightning``: a tiny ``Trainer`` over ``CommitStoreCheckpointIO`` commits its top-k and
  ``last.ckpt`` checkpoints, and a new one resumes with ``ckpt_path="last"``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from commitstore import CommitStore

FRAMEWORKS = ("torch", "lightning", "transformers")
OTHERS = {
    "torch": ["lightning", "transformers", "s3fs", "smbprotocol", "gcsfs", "azure.storage.blob"],
    "lightning": ["transformers", "s3fs", "smbprotocol", "gcsfs", "azure.storage.blob"],
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def main(extra: str, work: Path) -> int:
    import commitstore

    store = commitstore.open_store(work / "store")
    store.put_bytes("step_1.bin", b"x")
    store.latest()
    loaded = [m for m in FRAMEWORKS if m in sys.modules]
    assert not loaded, f"import commitstore imported {loaded}"
    present = [m for m in OTHERS[extra] if _installed(m)]
    assert not present, f"the {extra} extra brought {present}"

    import torch

    import commitstore.torch as cs_torch

    rec = cs_torch.save({"w": torch.arange(1000)}, store, "model-step5-bf16.pt")
    assert rec.step == 5
    state = cs_torch.load(store, mmap=True, cache_dir=work / "cache")
    assert torch.equal(state["w"], torch.arange(1000))
    assert torch.equal(cs_torch.load(store, "model-step5-bf16.pt")["w"], torch.arange(1000))
    if extra == "lightning":
        _lightning(commitstore.open_store(work / "lt"), work / "lt")
    print("framework_child: ok")
    return 0


def _lightning(store: CommitStore, root: Path) -> None:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from commitstore.lightning import CommitStoreCheckpointIO

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, _idx: int) -> object:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> object:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def trainer(max_steps: int) -> object:
        ckpt = pl.callbacks.ModelCheckpoint(
            dirpath=root / "ckpts",
            save_top_k=2,
            monitor="step",
            mode="max",
            every_n_train_steps=2,
            save_last=True,
        )
        return pl.Trainer(
            max_steps=max_steps,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            plugins=[CommitStoreCheckpointIO(store)],
            callbacks=[ckpt],
        )

    x = torch.randn(16, 4)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    trainer(6).fit(Tiny(), data)  # type: ignore[attr-defined]
    names = sorted(r.name for r in store.list())
    assert names == [
        "ckpts/epoch=0-step=4.ckpt",
        "ckpts/epoch=1-step=6.ckpt",
        "ckpts/last.ckpt",
    ], names
    resumed = trainer(8)
    resumed.fit(Tiny(), data, ckpt_path="last")  # type: ignore[attr-defined]
    assert resumed.global_step == 8  # type: ignore[attr-defined]
    assert store.verify().ok


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
