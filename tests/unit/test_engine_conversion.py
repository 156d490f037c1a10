"""The library-independent parts of the vLLM and SGLang engines: their outputs -> `Generation`,
bucketed weight streaming under a deadline, and engine selection. Neither library is needed."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from grpoflow.errors import UserError
from grpoflow.engines.external import WeightSyncTimeout, pack_samples, weight_buckets
from grpoflow.engines.sglang import check_sglang_result, samples_from_sglang
from grpoflow.engines.whole_batch import generate_batch

# Two prompts, n=2, EOS=2, pad=0:
#   sample 0: 10, EOS          -> ends at EOS
#   sample 1: 11, 12, 13       -> no EOS: cut by the length limit (truncated)
#   sample 2: EOS              -> empty answer
#   sample 3: 14, EOS, 15      -> the token after the first EOS is dropped
PROMPTS = [[5, 6, 7], [8]]
RESPONSES = [[10, 2], [11, 12, 13], [2], [14, 2, 15]]
LOG_PROBS = [[-0.5, -0.25], [-1.0, -2.0, -3.0], [-0.125], [-0.75, -1.5, -9.0]]


def test_pack_samples_by_hand():
    gen = pack_samples(PROMPTS, 2, RESPONSES, LOG_PROBS, pad_token_id=0, eos_token_id=2)
    assert gen.prompt_ids.tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 8], [0, 0, 8]]
    assert gen.prompt_mask.tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert gen.response_ids.tolist() == [[10, 2, 0], [11, 12, 13], [2, 0, 0], [14, 2, 0]]
    assert gen.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert gen.log_probs.tolist() == [[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0], [-0.125, 0.0, 0.0], [-0.75, -1.5, 0.0]]
    assert gen.log_probs.dtype == torch.float32
    assert gen.truncated.tolist() == [False, True, False, False]


def test_pack_samples_with_several_eos_ids():
    # 3 is a second EOS id (e.g. <|im_end|>): sample 1 now ends at its first token
    gen = pack_samples([[1]], 2, [[4, 2], [3, 4]], [[-1.0, -1.0], [-1.0, -1.0]], pad_token_id=0, eos_token_id=[2, 3])
    assert gen.response_ids.tolist() == [[4, 2], [3, 0]]
    assert gen.response_mask.tolist() == [[1, 1], [1, 0]]
    assert gen.truncated.tolist() == [False, False]


def test_pack_samples_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="need 4 responses"):
        pack_samples(PROMPTS, 2, RESPONSES[:3], LOG_PROBS[:3], pad_token_id=0, eos_token_id=2)
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        pack_samples([[1]], 1, [[4, 2]], [[-1.0]], pad_token_id=0, eos_token_id=2)


def test_samples_from_sglang():
    # The format of sglang.Engine.generate(input_ids=..., return_logprob=True): one dict per input,
    # meta_info.output_token_logprobs = [(logprob, token_id, text or None), ...], stop token included.
    outputs = [
        {"output_ids": [10, 2], "meta_info": {"output_token_logprobs": [(-0.5, 10, None), (-0.25, 2, None)],
                                              "finish_reason": {"type": "stop", "matched": 2}}},
        {"output_ids": [11, 12, 13], "meta_info": {
            "output_token_logprobs": [(-1.0, 11, None), (-2.0, 12, None), (-3.0, 13, None)],
            "finish_reason": {"type": "length", "length": 3}}},
        {"meta_info": {"output_token_logprobs": [[-0.125, 2, None]], "finish_reason": {"type": "stop"}}},
        {"meta_info": {"output_token_logprobs": [[-0.75, 14], [-1.5, 2]], "finish_reason": {"type": "stop"}}},
    ]
    responses, log_probs = samples_from_sglang(outputs)
    assert responses == [[10, 2], [11, 12, 13], [2], [14, 2]]
    assert log_probs == [[-0.5, -0.25], [-1.0, -2.0, -3.0], [-0.125], [-0.75, -1.5]]
    gen = pack_samples(PROMPTS, 2, responses, log_probs, pad_token_id=0, eos_token_id=2)
    assert gen.truncated.tolist() == [False, True, False, False]
    # one prompt alone comes back as a dict, not a list
    assert samples_from_sglang(outputs[0]) == ([[10, 2]], [[-0.5, -0.25]])


def test_samples_from_sglang_needs_logprobs():
    with pytest.raises(RuntimeError, match="return_logprob=True"):
        samples_from_sglang([{"output_ids": [1], "meta_info": {"finish_reason": {"type": "length"}}}])


def test_check_sglang_result():
    check_sglang_result((True, "ok"), "update")
    check_sglang_result(SimpleNamespace(success=True, message=""), "update")
    with pytest.raises(RuntimeError, match="rollout engine 'sglang': update failed: shape mismatch"):
        check_sglang_result((False, "shape mismatch"), "update")


def test_weight_buckets_group_by_bytes():
    # float32: 100 + 100 elements fill an 800-byte bucket; 300 (1200 B) is a bucket of its own; 50 starts a new one
    tensors = [(name, torch.zeros(k)) for name, k in (("a", 100), ("b", 100), ("c", 300), ("d", 50))]
    buckets = list(weight_buckets(iter(tensors), engine="vllm", timeout_s=5, version=1, bucket_bytes=800))
    assert [[name for name, _ in b] for b in buckets] == [["a", "b"], ["c"], ["d"]]
    assert buckets[0][0][1] is tensors[0][1]  # no copies


def test_weight_sync_that_hangs_raises_within_the_timeout():
    release = threading.Event()

    def sender():  # sends one tensor, then hangs like a dead actor rank
        yield "a", torch.zeros(4)
        release.wait(30)
        yield "b", torch.zeros(4)

    start = time.monotonic()
    try:
        with pytest.raises(WeightSyncTimeout, match=r"rollout engine 'sglang'.*version 7.*sync_timeout_s=0.5 s "
                                                    r"\(1 tensors received\)"):
            for _ in weight_buckets(sender(), engine="sglang", timeout_s=0.5, version=7):
                pass
    finally:
        release.set()
    assert time.monotonic() - start < 3


def test_weight_sync_sender_error_is_raised():
    def sender():
        yield "a", torch.zeros(4)
        raise KeyError("model.layers.9.mlp.up_proj.weight")

    with pytest.raises(KeyError, match="layers.9"):
        list(weight_buckets(sender(), engine="vllm", timeout_s=5, version=1))


def test_build_engine_names_the_choices_and_the_install():
    from grpoflow.models.tiny import build_char_tokenizer
    from grpoflow.engines.factory import build_engine

    tokenizer = build_char_tokenizer()
    with pytest.raises(ValueError, match=r"rollout.engine='tgi'.*'hf', 'sglang', 'vllm'"):
        build_engine("tgi", "/nonexistent", tokenizer)
    for name, module in (("vllm", "vllm"), ("sglang", "sglang")):
        try:
            __import__(module)
        except ImportError:
            with pytest.raises(ImportError, match=rf"pip install 'grpoflow\[{name}\]'"):
                build_engine(name, "/nonexistent", tokenizer)


def test_rollout_worker_builds_the_hf_engine(tiny_model_path):
    from grpoflow.config import Config, RolloutConfig
    from grpoflow.engines.hf import HFRolloutEngine
    from grpoflow.engines.protocol import SamplingParams
    from grpoflow.workers.rollout import RolloutWorker

    worker = RolloutWorker(0, 1, model_path=tiny_model_path, cfg=Config(rollout=RolloutConfig(sync_timeout_s=5.0)))
    assert isinstance(worker.engine, HFRolloutEngine)
    gen = generate_batch(worker.engine, [[10, 11]], SamplingParams(n=2, max_new_tokens=3))
    assert gen.response_ids.shape[0] == 2


def test_only_the_tested_vllm_release_is_accepted():
    from grpoflow.engines.vllm import check_vllm_version

    for tested in ("0.32.0", "0.32.1", "0.32.0+cpu"):
        check_vllm_version(tested)
    for other in ("0.10.2", "0.31.0", "0.33.0", "1.32.0", "main"):
        with pytest.raises(UserError, match=rf"vLLM {other} is installed, but grpoflow's vLLM engine is tested "
                                            r"with 0.32 only .* pip install 'vllm==0.32.\*'"):
            check_vllm_version(other)


def test_a_sleeping_vllm_engine_on_a_gpu_empties_torchs_cache_before_it_wakes(monkeypatch):
    from grpoflow.engines.vllm import VLLMRolloutEngine

    calls: list = []

    class FakeLLM:  # what the engine calls on vllm.LLM when it wakes
        def wake_up(self, tags=None):
            calls.append(("wake_up", tags))

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    engine = object.__new__(VLLMRolloutEngine)  # no vLLM here: only the state wake() reads
    engine.llm, engine._device, engine._asleep = FakeLLM(), torch.device("cuda", 0), True
    engine.wake()
    assert calls == ["empty_cache", ("wake_up", None)] and not engine._asleep


def test_a_rank_in_a_world_starts_vllm_with_the_external_launcher(tmp_path):
    """A rank that joined a torch.distributed world (backend=ray) makes vLLM join it (external_launcher, as verl and
    TRL do); without a world vLLM keeps its own uniprocess executor."""
    import torch.distributed as dist

    from grpoflow.engines.vllm import executor_options

    assert executor_options() == {}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert executor_options() == {"distributed_executor_backend": "external_launcher"}
    finally:
        dist.destroy_process_group()
