"""A request paused between two decode steps keeps every row it has written, on the real engine (the
default model, CPU). Between steps the newest token has been through the model, so its row is
written; when that row opens a new block, a snapshot counted by the newest token's position
(kv_len) left the block behind, and after the pause the next step attended to whatever was there."""
import numpy as np

from engine.runner.runner import ModelRunner
from engine.runner.sampler import Sampler, SamplingParams
from engine.runner.sequence import Sequence

BLOCK = 16


def fresh_sequence(runner: ModelRunner, prompt: tuple[int, ...]) -> Sequence:
    seq = Sequence(id=1, prompt=prompt, max_new=8, sampler=Sampler(SamplingParams(temperature=0.0), prompt),
                   stop_ids=frozenset())
    seq.table = runner.pool.allocate(runner.pool.blocks_for(len(prompt) + 4))
    return seq


def step(runner: ModelRunner, seq: Sequence) -> None:
    """One decode step as the loop runs it: the next token drawn, then through the model."""
    token = runner.sample(seq)
    seq.sampler.accept(token)
    seq.generated.append(token)
    runner.decode_batch([seq])


def test_a_row_that_opens_a_block_survives_a_pause_between_steps(loaded):
    runner = ModelRunner(loaded.cfg, loaded.weights, loaded.backend, ctx=256, chunk=BLOCK, eos_ids=frozenset(),
                         cuda_graphs=False, max_running=2, blocks=32, block_size=BLOCK)
    prompt = tuple(range(100, 100 + BLOCK))  # one block: the first token's row opens the second

    def run(pause: bool) -> list[float]:
        seq = fresh_sequence(runner, prompt)
        runner.read_prompt_chunk(seq)
        step(runner, seq)  # token 1 at position 16: the first row of block 1
        assert seq.rows == BLOCK + 1 and seq.kv_len == BLOCK
        if pause:
            snap = runner.spill(seq)
            assert snap.k.shape[1] == 2  # both blocks
            runner.pool.release(seq.table)
            scratch = runner.pool.allocate(2)  # the freed blocks written over by someone else
            runner.kv.keys[:, scratch] = 7.0
            runner.kv.values[:, scratch] = 7.0
            seq.table = runner.pool.allocate(runner.pool.blocks_for(seq.rows + 4))
            runner.restore(seq, snap)
            runner.pool.release(scratch)
        step(runner, seq)
        logits = np.asarray(seq.logits, dtype=np.float64).copy()
        runner.pool.release(seq.table)
        return logits

    assert np.array_equal(run(pause=True), run(pause=False))
