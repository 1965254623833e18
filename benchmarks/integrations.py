"""What an asynchronous commit still costs the training loop.

``python -m benchmarks.integrations``:

- Lightning: seconds ``save_checkpoint`` blocks the caller for a state of ``--size-mib``, for
  ``CommitStoreCheckpointIO(store)`` (the whole commit), Lightning's
  ``AsyncCheckpointIO(CommitStoreCheckpointIO(store))`` (clones every tensor) and
  ``CommitStoreCheckpointIO(store, asynchronous=True)`` (``save_async``'s snapshot). Each save
  waits for the previous one first (teardown), so each run measures one snapshot, never a queue.
- HF: for a tiny GPT-2 ``Trainer``, the seconds of the Trainer's own synchronous
  ``_save_checkpoint`` (weights, optimizer, scheduler, state) and of
  ``CommitStoreCallback.on_save``, with ``asynchronous=False`` and ``True``.

Medians of ``--repeat`` runs (perf_counter, in-process); no target: reported. Written to
``benchmarks/results/async_integrations.json`` (or ``BENCH_RESULTS_DIR``), with the commit measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ._harness import commit, results_dir


def _lightning(size_mib: int, repeat: int, work: Path) -> dict[str, float]:
    import torch
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    import commitstore
    from commitstore.lightning import CommitStoreCheckpointIO

    per = size_mib * (1 << 20) // 4 // 8
    state = {f"w{i}": torch.randn(per) for i in range(8)}
    out: dict[str, float] = {}
    for label in ("sync", "lightning AsyncCheckpointIO", "asynchronous=True"):
        root = work / label.replace(" ", "_").replace("=", "")
        store = commitstore.open_store(str(root))
        io: Any = CommitStoreCheckpointIO(store, asynchronous=label == "asynchronous=True")
        if label.startswith("lightning"):
            io = AsyncCheckpointIO(io)
        times = []
        for i in range(repeat):
            ckpt = {"global_step": i, "epoch": 0, "state_dict": state}
            start = time.perf_counter()
            io.save_checkpoint(ckpt, str(root / f"step={i}.ckpt"))
            times.append(time.perf_counter() - start)
            io.teardown()  # the next run starts with nothing in flight
        out[label] = statistics.median(times)
        store.close()
    return out


def _hf(repeat: int, work: Path) -> dict[str, dict[str, float]]:
    import torch
    import transformers

    import commitstore
    from commitstore.hf import CommitStoreCallback

    class Data(torch.utils.data.Dataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return 1024

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.tensor([(i * 7 + k) % 50 for k in range(8)])
            return {"input_ids": ids, "labels": ids}

    class Timed(CommitStoreCallback):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.times: list[float] = []

        def on_save(self, *a: Any, **kw: Any) -> None:
            start = time.perf_counter()
            super().on_save(*a, **kw)
            self.times.append(time.perf_counter() - start)

    out: dict[str, dict[str, float]] = {}
    for asynchronous in (False, True):
        label = f"asynchronous={asynchronous}"
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=50)
        args = transformers.TrainingArguments(
            output_dir=str(work / f"hf-out-{asynchronous}"),
            max_steps=repeat,
            save_steps=1,
            per_device_train_batch_size=2,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            logging_steps=1000,
        )
        store = commitstore.open_store(str(work / f"hf-store-{asynchronous}"))
        cb = Timed(store, asynchronous=asynchronous)
        trainer = transformers.Trainer(
            model=transformers.GPT2LMHeadModel(config),
            args=args,
            train_dataset=Data(),
            callbacks=[cb],
        )
        saves: list[float] = []
        original = trainer._save_checkpoint

        def timed_save(*a: Any, _orig: Any = original, saves: Any = saves, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return _orig(*a, **kw)
            finally:
                saves.append(time.perf_counter() - start)

        trainer._save_checkpoint = timed_save
        trainer.train()
        out[label] = {
            "trainer _save_checkpoint s": statistics.median(saves),
            "callback on_save s": statistics.median(cb.times),
        }
        store.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.integrations")
    p.add_argument("--size-mib", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = {
            "lightning save_checkpoint blocks the caller, s (median)": _lightning(
                a.size_mib, a.repeat, work
            ),
            "size_mib": a.size_mib,
            "repeat": a.repeat,
            "hf, s (median)": _hf(a.repeat, work),
            "commit": commit(),
        }
    out = results_dir() / "async_integrations.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
