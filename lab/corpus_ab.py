"""A/B of the lookup's corpus (engine/sources/corpus.py) on one person's traffic, in one process.

The recorded answers of a learn store (`serve --learn DIR`) are the corpus; prompts the store never saw are
generated with the hybrid draft source (the default) twice each, with and without the corpus, in alternating
order, and compared with plain decoding token for token. Prints tok/s, tokens per target call and the lookup's
drafted / accepted tokens per arm.

    python lab/corpus_ab.py --store DIR --prompts FILE.json [-t 2] [--rounds 2]

FILE.json: [{"prompt": [token ids, rendered as the server renders them]}, ...] (lab/learn_harness.py's rendered
rows, or what a script dumped). Used in docs/learning.md ("Recorded answers as lookup drafts").
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dflash_gguf.engine.sampling import SamplingParams
from dflash_gguf.engine.session import Engine
from dflash_gguf.engine.sources.corpus import DEFAULT_MAX_TOKENS, Corpus
from dflash_gguf.learn.store import LearnStore, Recorder
from dflash_gguf.assets import shipped_drafter_for
from dflash_gguf.packaged_models import smollm2_q4_1
from dflash_gguf.settings import EngineSettings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("-m", "--model", type=Path, default=None, help="target (default: the embedded SmolLM2)")
    ap.add_argument("-md", "--drafter", type=Path, default=None)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    target = a.model or smollm2_q4_1()
    drafter = a.drafter or shipped_drafter_for(target)
    corpus = Corpus(Recorder(LearnStore(a.store), target).recent_answers(DEFAULT_MAX_TOKENS))
    prompts = [r["prompt"] for r in json.loads(a.prompts.read_text())]
    engine = Engine(EngineSettings(target=target, drafter=drafter, n_threads=a.threads, draft_source="hybrid"),
                    corpus=corpus)
    lookup = engine.decoder("hybrid").lookup
    arms = {False: [0, 0, 0.0, 0, 0], True: [0, 0, 0.0, 0, 0]}
    equal = 0
    try:
        for r in range(a.rounds):
            for i, prompt in enumerate(prompts):
                plain = engine.generate(prompt, a.max_tokens, SamplingParams(), speculative=False).tokens
                for use in ((False, True) if (i + r) % 2 == 0 else (True, False)):
                    lookup.corpus = corpus if use else None
                    t0 = time.perf_counter()
                    g = engine.generate(prompt, a.max_tokens, SamplingParams())
                    x = arms[use]
                    x[0] += len(g.tokens)
                    x[1] += g.n_target_calls
                    x[2] += time.perf_counter() - t0
                    x[3] += g.n_lookup_drafted
                    x[4] += g.n_lookup_accepted
                    equal += g.tokens == plain
    finally:
        engine.close()
    print(f"corpus: {len(corpus)} answers, {corpus.n_tokens} tokens; {len(prompts)} prompts x {a.rounds} rounds")
    for use, x in arms.items():
        print(f"corpus {'on ' if use else 'off'}: {x[0] / x[2]:.1f} tok/s, {x[0] / x[1]:.3f} tokens per target call, "
              f"lookup drafted {x[3]} accepted {x[4]}")
    print(f"speedup of the corpus: {(arms[True][0] / arms[True][2]) / (arms[False][0] / arms[False][2]):.3f}x; "
          f"equal to plain {equal} / {2 * len(prompts) * a.rounds}")


if __name__ == "__main__":
    main()
