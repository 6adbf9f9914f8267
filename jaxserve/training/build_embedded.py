"""Rebuild the embedded default (target + tokenizer + EAGLE-3 head) end to end, one stage after another.

    python -m jaxserve.training.build_embedded --work build/embedded --target-minutes 15 --draft-minutes 8

Stages, each also runnable alone (see `jaxserve.training`): corpus -> tokenizer -> target -> draft -> export
into `jaxserve/assets/embedded` (`--no-export` to leave the package data alone). A stage whose output already
exists in `--work` is skipped, so re-running after an interruption resumes at the first missing stage; a
target stopped part way keeps its last periodic checkpoint in `<work>/target`, which
`--resume-target` continues (fresh optimiser, `--target-minutes` more).
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

from jaxserve.training import corpus, draft, export, target, tokenizer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="build/embedded")
    p.add_argument("--target-minutes", type=float, default=15.0)
    p.add_argument("--draft-minutes", type=float, default=8.0)
    p.add_argument("--resume-target", action="store_true", help="continue training <work>/target")
    p.add_argument("--target-args", default="", help="extra flags for jaxserve.training.target")
    p.add_argument("--draft-args", default="", help="extra flags for jaxserve.training.draft")
    p.add_argument("--no-export", action="store_true")
    p.add_argument("--out", default=str(export.EMBEDDED_DIR))
    args = p.parse_args(argv)
    work = Path(args.work)
    paths = {name: str(work / name) for name in ("corpus", "tokenizer", "target", "draft")}
    started = time.perf_counter()

    def stage(name: str, done: bool, run) -> None:
        if done:
            print(json.dumps({"stage": name, "skipped": "output exists"}), flush=True)
            return
        t0 = time.perf_counter()
        run()
        print(json.dumps({"stage": name, "wall_s": round(time.perf_counter() - t0, 1)}), flush=True)

    stage("corpus", (work / "corpus" / "train.txt").exists(),
          lambda: corpus.main(["--out", paths["corpus"]]))
    stage("tokenizer", (work / "tokenizer" / "tokenizer.json").exists(),
          lambda: tokenizer.main(["--corpus", paths["corpus"], "--out", paths["tokenizer"]]))
    target_done = (work / "target" / "training.json").exists() and not args.resume_target
    resume = ["--init-from", paths["target"], "--warmup", "20"] if args.resume_target else []
    stage("target", target_done, lambda: target.main(
        ["--corpus", paths["corpus"], "--tokenizer", paths["tokenizer"], "--out", paths["target"],
         "--minutes", str(args.target_minutes), *resume, *shlex.split(args.target_args)]))
    stage("draft", (work / "draft" / "training.json").exists() and not args.resume_target, lambda: draft.main(
        ["--target", paths["target"], "--tokenizer", paths["tokenizer"], "--corpus", paths["corpus"],
         "--out", paths["draft"], "--minutes", str(args.draft_minutes), *shlex.split(args.draft_args)]))
    if not args.no_export:
        stage("export", False, lambda: export.main(
            ["--target", paths["target"], "--tokenizer", paths["tokenizer"], "--draft", paths["draft"],
             "--out", args.out]))
    print(json.dumps({"total_wall_s": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
