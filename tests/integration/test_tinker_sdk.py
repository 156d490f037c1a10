"""`grpoflow serve tinker` driven by the official, unmodified `tinker` SDK on the tiny model: a supervised and an RL
step, sampled log-probs against teacher-forced ones, an importance_sampling update against its hand value,
sampler weights that the next sample uses, several clients at once, error shapes, and a killed server restarted
on its folder serving the saved states."""

from __future__ import annotations

import concurrent.futures
import math

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from tinker_server_process import API_KEY, ServerProcess  # noqa: E402

MODEL = "builtin:tiny-0.5m"
TIMEOUT = 120  # no request may take longer: nothing hangs


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("tinker") / "root", f"model.path={MODEL}", "tinker.max_request_mb=2",
                         "tinker.max_sample_tokens=4000")
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def service(server):
    client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    yield client
    client.close("success")


def training_client(service, seed=0, rank=4):
    return service.create_lora_training_client(base_model=MODEL, rank=rank, seed=seed).result(TIMEOUT)


def sft_datum(tokenizer, prompt: str, answer: str) -> types.Datum:
    """Train on the answer only: input = all but the last token, targets shifted by one, weight 0 on the prompt."""
    p, a = tokenizer.encode(prompt), tokenizer.encode(answer)
    tokens = p + a
    weights = [0.0] * (len(p) - 1) + [1.0] * len(a)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})


def forward_logprobs(tc, tokens: list[int]) -> np.ndarray:
    """Teacher-forced log p(tokens[i] | tokens[:i]) for i >= 1, from the training client."""
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:]})
    out = tc.forward([datum], "cross_entropy").result(TIMEOUT)
    return out.loss_fn_outputs[0]["logprobs"].to_numpy()


def test_supervised_steps_lower_the_loss_and_the_tokenizer_loads_offline(service):
    tc = training_client(service)
    info = tc.get_info()
    assert info.is_lora and info.lora_rank == 4
    tokenizer = tc.get_tokenizer()                     # from model_data.tokenizer_id: a local folder
    data = [sft_datum(tokenizer, f"{a}+{b}=", f"{a + b}") for a, b in [(12, 34), (5, 7), (40, 2)]]
    losses = []
    for _ in range(5):
        fwd_bwd = tc.forward_backward(data, "cross_entropy")
        optim = tc.optim_step(types.AdamParams(learning_rate=2e-2))
        losses.append(fwd_bwd.result(TIMEOUT).metrics["loss:sum"])
        assert optim.result(TIMEOUT).metrics["grad_norm:mean"] > 0
    assert losses[-1] < 0.85 * losses[0], losses


def test_rl_step_samples_scores_and_updates(service):
    """One GRPO-style step as the cookbook's rl_loop writes it: sample a group, centre the rewards, train with
    importance_sampling on the sampled tokens."""
    tc = training_client(service, seed=1)
    tokenizer = tc.get_tokenizer()
    sampler = tc.save_weights_and_get_sampling_client().result(TIMEOUT)
    prompt = types.ModelInput.from_ints(tokenizer.encode("3+4="))
    result = sampler.sample(prompt, 4, types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)).result(TIMEOUT)
    assert len(result.sequences) == 4 and len({s.sequence_id for s in result.sequences}) == 4
    rewards = [float(tokenizer.decode(s.tokens).startswith("7")) + len(s.tokens) / 10 for s in result.sequences]
    mean = sum(rewards) / len(rewards)
    data = []
    for seq, reward in zip(result.sequences, rewards):
        ob = prompt.length - 1
        tokens = prompt.to_ints() + seq.tokens
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
            "target_tokens": tokens[1:], "logprobs": [0.0] * ob + seq.logprobs,
            "advantages": [0.0] * ob + [reward - mean] * len(seq.tokens)}))
    out = tc.forward_backward(data, "importance_sampling").result(TIMEOUT)
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(TIMEOUT)
    # on-policy the ratio is 1 on every sampled token, so the loss is -sum of the advantages (0: they are centred)
    assert abs(out.metrics["loss:sum"] - -sum((r - mean) * len(s.tokens) for s, r in
                                              zip(result.sequences, rewards))) < 1e-3


def test_sampled_logprobs_equal_teacher_forced_ones(service):
    tc = training_client(service, seed=2)
    tokenizer = tc.get_tokenizer()
    tc.forward_backward([sft_datum(tokenizer, "1+1=", "2")], "cross_entropy").result(TIMEOUT)
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result(TIMEOUT)   # the adapters are no longer zero
    sampler = tc.save_weights_and_get_sampling_client().result(TIMEOUT)
    prompt = tokenizer.encode("21+13=")
    result = sampler.sample(types.ModelInput.from_ints(prompt), 3, types.SamplingParams(max_tokens=8),
                            include_prompt_logprobs=True).result(TIMEOUT)
    for seq in result.sequences:
        teacher = forward_logprobs(tc, prompt + seq.tokens)
        np.testing.assert_allclose(seq.logprobs, teacher[len(prompt) - 1:], atol=2e-4)
    assert result.prompt_logprobs[0] is None
    np.testing.assert_allclose(result.prompt_logprobs[1:], forward_logprobs(tc, prompt), atol=2e-4)


def test_importance_sampling_loss_and_gradient_match_the_hand_value(service):
    """Off-policy by a known shift: sampling log-probs q = lp - 0.3, so r = e^0.3 on every token and
    loss = -sum(r * A); its gradient -sum(r * A * dlp) is that of cross_entropy with weights r * A. Two models
    from the same seed, one updated with each, must end up equal."""
    is_client, ce_client = training_client(service, seed=7), training_client(service, seed=7)
    tokenizer = is_client.get_tokenizer()
    tokens = tokenizer.encode("17+25=42")
    advantages = np.array([0.0] * 4 + [1.0, -0.5, 2.0], dtype=np.float32)
    lp = forward_logprobs(is_client, tokens)
    ratio = math.exp(0.3)
    data = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": tokens[1:], "logprobs": (lp - 0.3).astype(np.float32), "advantages": advantages})
    out = is_client.forward_backward([data], "importance_sampling").result(TIMEOUT)
    assert out.metrics["loss:sum"] == pytest.approx(-ratio * advantages.sum(), rel=1e-4)   # -e^0.3 * 2.5
    ce = types.Datum(model_input=data.model_input, loss_fn_inputs={
        "target_tokens": tokens[1:], "weights": (ratio * advantages).astype(np.float32)})
    ce_client.forward_backward([ce], "cross_entropy").result(TIMEOUT)
    adam = types.AdamParams(learning_rate=1e-2, eps=1e-4)   # eps well above float noise in the gradients
    for client in (is_client, ce_client):
        client.optim_step(adam).result(TIMEOUT)
    probe = tokenizer.encode("99+1=100")
    after_is, after_ce = forward_logprobs(is_client, probe), forward_logprobs(ce_client, probe)
    assert np.abs(after_is - forward_logprobs(training_client(service, seed=7), probe)).max() > 1e-3  # it moved
    np.testing.assert_allclose(after_is, after_ce, atol=1e-5)


def test_sampler_weights_are_the_ones_the_next_sample_uses(server, service):
    tc = training_client(service, seed=3)
    tokenizer = tc.get_tokenizer()
    before = tc.save_weights_for_sampler("before").result(TIMEOUT).path
    for _ in range(5):
        tc.forward_backward([sft_datum(tokenizer, "8+8=", "16")], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=3e-3))
    after = tc.save_weights_for_sampler("after").result(TIMEOUT).path
    probe = tokenizer.encode("8+8=16")
    lp_old = service.create_sampling_client(model_path=before).compute_logprobs(
        types.ModelInput.from_ints(probe)).result(TIMEOUT)
    lp_new = service.create_sampling_client(model_path=after).compute_logprobs(
        types.ModelInput.from_ints(probe)).result(TIMEOUT)
    trained = forward_logprobs(tc, probe)
    np.testing.assert_allclose(lp_new[1:], trained, atol=2e-4)          # the new weights
    assert np.abs(np.array(lp_old[1:]) - trained).max() > 1e-2          # not the old ones
    assert sum(lp_new[-2:]) > sum(lp_old[-2:])                          # trained towards "16"
    root = server.log.with_name(server.log.name.split("-server-")[0])  # tinker.root: the log lies beside it
    saved = sorted(p.name for p in root.glob("runs/*/sampler_weights/after/*"))
    assert "adapters.safetensors" in saved and "model.safetensors" not in saved  # a LoRA model: adapters, no copy


def test_several_clients_at_once(service):
    """Two training clients and their samplers used from two threads: each trains its own model."""
    def run(seed, answer):
        tc = training_client(service, seed=seed)
        tokenizer = tc.get_tokenizer()
        losses = []
        for _ in range(4):
            fb = tc.forward_backward([sft_datum(tokenizer, "5+5=", answer)], "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=3e-3))
            losses.append(fb.result(TIMEOUT).metrics["loss:sum"])
        sampler = tc.save_weights_and_get_sampling_client().result(TIMEOUT)
        prompt = types.ModelInput.from_ints(tokenizer.encode("5+5="))
        return losses, sampler.compute_logprobs(prompt.append_int(tokenizer.encode(answer)[0])).result(TIMEOUT)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(run, 11, "10"), pool.submit(run, 11, "99")
        (losses_a, _), (losses_b, _) = a.result(), b.result()
    assert losses_a[-1] < losses_a[0] and losses_b[-1] < losses_b[0]
    assert losses_a[0] != losses_b[0]                 # same seed, different data: two models, not one


def test_bad_requests_answer_with_the_sdk_error_shape(service, server):
    tc = training_client(service)
    tokenizer = tc.get_tokenizer()
    datum = sft_datum(tokenizer, "1+2=", "3")
    with pytest.raises(tinker.RequestFailedError, match="not supported") as refused:
        tc.forward_backward([datum], "stable_reinforce").result(TIMEOUT)
    assert refused.value.category == types.RequestErrorCategory.User
    for name in ("..", "a/../../b", "a/b"):   # refused, never stored under another name
        with pytest.raises(tinker.BadRequestError, match="not a usable checkpoint name"):
            tc.save_state(name).result(TIMEOUT)
    # refused requests keep their place in the client's order: the same client goes on working
    assert tc.forward_backward([datum], "cross_entropy").result(TIMEOUT).metrics["loss:sum"] > 0
    with pytest.raises(tinker.RequestFailedError, match="needs loss_fn_inputs"):
        training_client(service).forward_backward([datum], "ppo").result(TIMEOUT)
    with pytest.raises(tinker.RequestFailedError, match="base_model=.*is not a folder"):
        service.create_lora_training_client(base_model="no/such-model", rank=2).result(TIMEOUT)
    sampler = training_client(service).save_weights_and_get_sampling_client().result(TIMEOUT)
    with pytest.raises(tinker.BadRequestError, match="top_k"):
        sampler.sample(types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2, top_k=5)
                       ).result(TIMEOUT)
    with pytest.raises(tinker.NotFoundError, match="not supported here"):
        service.create_rest_client().list_training_runs().result(TIMEOUT)
    with pytest.raises(tinker.AuthenticationError, match="API key"):   # the server was started with tinker.api_key
        tinker.ServiceClient(base_url=server.url, api_key="tml-wrong").create_lora_training_client(
            base_model=MODEL, rank=2).result(TIMEOUT)


def test_a_killed_server_restarted_on_its_folder_serves_the_saved_states(tmp_path):
    root = tmp_path / "root"
    first = ServerProcess(root, f"model.path={MODEL}")
    client = tinker.ServiceClient(base_url=first.url, api_key=API_KEY)
    tc = training_client(client, seed=5)
    tokenizer = tc.get_tokenizer()
    for _ in range(2):
        tc.forward_backward([sft_datum(tokenizer, "6+1=", "7")], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=5e-2))
    state = tc.save_state("s1").result(TIMEOUT).path
    sampler_path = tc.save_weights_for_sampler("w1").result(TIMEOUT).path
    probe = tokenizer.encode("6+1=7")
    expected = forward_logprobs(tc, probe)
    first.kill()                                      # SIGKILL: no chance to flush anything more
    client.close("success")

    second = ServerProcess(root, f"model.path={MODEL}")
    try:
        client = tinker.ServiceClient(base_url=second.url, api_key=API_KEY)
        resumed = client.create_training_client_from_state_with_optimizer(state).result(TIMEOUT)
        assert resumed.get_info().lora_rank == 4
        np.testing.assert_array_equal(forward_logprobs(resumed, probe), expected)
        sampled = client.create_sampling_client(model_path=sampler_path).compute_logprobs(
            types.ModelInput.from_ints(probe)).result(TIMEOUT)
        np.testing.assert_allclose(sampled[1:], expected, atol=2e-4)
        # and it trains on from there (the optimizer state came back too)
        resumed.forward_backward([sft_datum(tokenizer, "6+1=", "7")], "cross_entropy").result(TIMEOUT)
        resumed.optim_step(types.AdamParams(learning_rate=5e-2)).result(TIMEOUT)
        client.close("success")
    finally:
        second.kill()


def test_full_fine_tuning_when_the_request_asks_for_no_lora(server, service):
    """The SDK's CreateModelRequest with lora_config=None (its helpers always send one) trains every weight."""
    import httpx

    headers = {"X-API-Key": API_KEY}
    request = types.CreateModelRequest(session_id="raw", model_seq_id=0, base_model=MODEL, lora_config=None)
    future = httpx.post(f"{server.url}/api/v1/create_model", headers=headers,
                        json=request.model_dump(mode="json", exclude_none=True)).json()
    done = httpx.post(f"{server.url}/api/v1/retrieve_future", headers=headers, timeout=60,
                      json={"request_id": future["request_id"]}).json()
    info = httpx.post(f"{server.url}/api/v1/get_info", headers=headers, json={"model_id": done["model_id"]}).json()
    assert info["is_lora"] is False and "lora_rank" not in info


def test_a_refused_request_never_wedges_its_client(service):
    """The SDK numbers every request of a training client; one answered 404 (a route this server lacks) or 400
    (a NaN learning rate) must still pass its number, or every later request of the client waits forever."""
    tc = training_client(service)
    datum = sft_datum(tc.get_tokenizer(), "1+2=", "3")
    with pytest.raises(tinker.NotFoundError, match="not supported here"):
        tc.save_weights_external("hf").result(TIMEOUT)
    with pytest.raises(tinker.BadRequestError, match="learning_rate"):
        tc.optim_step(types.AdamParams(learning_rate=float("nan"))).result(TIMEOUT)
    assert tc.forward_backward([datum], "cross_entropy").result(30).metrics["loss:sum"] > 0
    assert tc.optim_step(types.AdamParams(learning_rate=1e-3)).result(30).metrics["grad_norm:mean"] > 0


def test_limits_refuse_what_would_exhaust_the_server(server, service):
    """Every limit answers a 4xx in the SDK's error shape (the SDK retries 5xx): a prompt past the model's context
    (reported as max_context_length), too many samples x tokens, sampling parameters out of range, negative
    target tokens."""
    capabilities = service.get_server_capabilities()
    assert {m.max_context_length for m in capabilities.supported_models} == {256}   # the tiny model's context
    tc = training_client(service)
    sampler = tc.save_weights_and_get_sampling_client().result(TIMEOUT)
    prompt = types.ModelInput.from_ints([5] * 10)
    refused = [(types.ModelInput.from_ints([5] * 300), 1, types.SamplingParams(max_tokens=4), "context of 256"),
               (prompt, 1, types.SamplingParams(max_tokens=250), "context of 256"),
               (prompt, 5000, types.SamplingParams(max_tokens=8), "tinker.max_sample_tokens"),
               (prompt, 1, types.SamplingParams(max_tokens=4, temperature=-1.0), "temperature=-1.0"),
               (prompt, 1, types.SamplingParams(max_tokens=4, top_p=0.0), "top_p=0.0"),
               (prompt, 1, types.SamplingParams(max_tokens=4, top_p=1.5), "top_p=1.5")]
    for p, n, params, why in refused:
        with pytest.raises(tinker.BadRequestError, match=why):
            sampler.sample(p, n, params).result(TIMEOUT)
    negative = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                           loss_fn_inputs={"target_tokens": [2, -3, 4]})
    with pytest.raises(tinker.RequestFailedError, match="target_tokens must lie in") as failed:
        tc.forward_backward([negative], "cross_entropy").result(TIMEOUT)
    assert failed.value.category == types.RequestErrorCategory.User
    long = types.Datum(model_input=types.ModelInput.from_ints([1] * 300), loss_fn_inputs={"target_tokens": [1] * 300})
    with pytest.raises(tinker.RequestFailedError, match="context of 256"):
        tc.forward_backward([long], "cross_entropy").result(TIMEOUT)
    assert len(sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4)).result(TIMEOUT).sequences) == 2


def test_bodies_are_bounded_and_malformed_ones_get_the_error_shape(server):
    """tinker.max_request_mb=2 here: a larger body, and a small zstd body that decompresses past it, are refused
    (413) while they arrive; a body that does not parse is a user error (400), never a plain-text 500."""
    import httpx
    import zstandard

    url, key = f"{server.url}/api/v1", {"X-API-Key": API_KEY}
    proto = {**key, "Content-Type": "application/x-protobuf"}
    bomb = zstandard.ZstdCompressor().compress(bytes(20 * 2**20))           # 20 MiB of zeros in a few KB
    assert len(bomb) < 10_000
    answer = httpx.post(f"{url}/forward_backward", content=bomb, headers={**proto, "Content-Encoding": "zstd"})
    assert answer.status_code == 413 and answer.json()["category"] == "user"
    answer = httpx.post(f"{url}/forward_backward", content=bytes(3 * 2**20), headers=proto)
    assert answer.status_code == 413 and "tinker.max_request_mb" in answer.json()["error"]
    for body, headers in [(b"{not json", {**key, "Content-Type": "application/json"}),
                          (b"\xff\xfe garbage", proto),
                          (b"not zstd", {**proto, "Content-Encoding": "zstd"})]:
        path = "optim_step" if b"json" in body else "forward_backward"
        answer = httpx.post(f"{url}/{path}", content=body, headers=headers)
        assert answer.status_code == 400 and answer.json()["category"] == "user", answer.text
    wrong_method = httpx.get(f"{url}/optim_step", headers=key)
    assert wrong_method.status_code == 405 and wrong_method.json()["category"] == "user"


def test_only_local_programs_are_answered(server):
    """A web page can make a browser send requests to 127.0.0.1: with its own Host name (DNS rebinding) or a JSON
    body typed text/plain (a "simple" request, sent without asking). Both are refused."""
    import httpx

    url, key = f"{server.url}/api/v1", {"X-API-Key": API_KEY}
    assert httpx.get(f"{url}/get_server_capabilities", headers=key).status_code == 200
    foreign = httpx.get(f"{url}/get_server_capabilities", headers={**key, "Host": f"evil.example:{server.port}"})
    assert foreign.status_code == 403 and "not this server's address" in foreign.json()["error"]
    body = types.CreateSessionRequest(tags=[], user_metadata=None, sdk_version="0").model_dump_json()
    plain = httpx.post(f"{url}/create_session", headers={**key, "Content-Type": "text/plain"}, content=body)
    assert plain.status_code == 415 and "text/plain" in plain.json()["error"]
    assert API_KEY not in server.log.read_text()   # the key is never printed


def test_topk_prompt_logprobs_are_the_training_forwards_best_tokens(service):
    """topk_prompt_logprobs (sdft, off-policy distillation): one row per prompt token, none at position 0, the k
    likeliest next tokens best first, whose log-probs the training forward gives too (2-D target_tokens)."""
    tc = training_client(service, seed=4)
    tokenizer = tc.get_tokenizer()
    tc.forward_backward([sft_datum(tokenizer, "2+2=", "4")], "cross_entropy").result(TIMEOUT)
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result(TIMEOUT)
    sampler = tc.save_weights_and_get_sampling_client().result(TIMEOUT)
    prompt = tokenizer.encode("12+30=42")
    k = 5
    result = sampler.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=1),
                            include_prompt_logprobs=True, topk_prompt_logprobs=k).result(TIMEOUT)
    rows = result.topk_prompt_logprobs
    assert len(rows) == len(prompt) and rows[0] is None and all(len(r) == k for r in rows[1:])
    ids = np.array([[t for t, _ in r] for r in rows[1:]])
    lps = np.array([[lp for _, lp in r] for r in rows[1:]])
    assert (np.diff(lps, axis=1) <= 0).all()                     # best first
    datum = types.Datum(model_input=types.ModelInput.from_ints(prompt[:-1]),
                        loss_fn_inputs={"target_tokens": types.TensorData.from_numpy(ids.astype(np.int64))})
    teacher = tc.forward([datum], "cross_entropy").result(TIMEOUT).loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(teacher.reshape(lps.shape), lps, atol=2e-4)
    for i, (tokens, logprob) in enumerate(zip(ids, result.prompt_logprobs[1:])):
        assert logprob <= lps[i, 0] + 1e-5                       # no prompt token beats the best one
        if prompt[i + 1] in tokens:
            assert abs(lps[i, list(tokens).index(prompt[i + 1])] - logprob) < 2e-4


def test_an_oversize_forward_backward_still_passes_its_seq_id(server):
    """Numbered the way the SDK numbers a training client's requests (seq_id 1, 2, ...): a forward_backward too
    large to read (413, raw and zstd-compressed) still names its model and seq_id, so seq_id 3 runs."""
    import httpx
    import zstandard
    from tinker.proto import tinker_public_pb2 as pb

    url, key = f"{server.url}/api/v1", {"X-API-Key": API_KEY}

    def result(future: dict) -> dict:
        return httpx.post(f"{url}/retrieve_future", headers=key, timeout=60,
                          json={"request_id": future["request_id"]}).json()

    create = types.CreateModelRequest(session_id="raw-oversize", model_seq_id=0, base_model=MODEL,
                                      lora_config=types.LoraConfig(rank=2))
    model_id = result(httpx.post(f"{url}/create_model", headers=key,
                                 json=create.model_dump(mode="json", exclude_none=True)).json())["model_id"]
    huge = pb.ForwardBackwardRequest(model_id=model_id, seq_id=1, loss_fn="cross_entropy",
                                     data=[pb.Datum()] * 1).SerializeToString() + bytes(3 * 2**20)
    proto = {**key, "Content-Type": "application/x-protobuf"}
    assert httpx.post(f"{url}/forward_backward", content=huge, headers=proto).status_code == 413
    bomb = zstandard.ZstdCompressor().compress(pb.ForwardBackwardRequest(model_id=model_id, seq_id=2)
                                               .SerializeToString() + bytes(20 * 2**20))
    answer = httpx.post(f"{url}/forward_backward", content=bomb, headers={**proto, "Content-Encoding": "zstd"})
    assert answer.status_code == 413
    step = types.OptimStepRequest(adam_params=types.AdamParams(learning_rate=1e-3), model_id=model_id, seq_id=3)
    future = httpx.post(f"{url}/optim_step", headers=key, json=step.model_dump(mode="json", exclude_none=True))
    assert "grad_norm:mean" in result(future.json())["metrics"]


def test_the_docs_snippet_runs_as_written_without_an_sdk_warning(server, service, monkeypatch):
    """docs/tinker.md's first Python snippet, run as it is printed (the model path replaced), warns nothing: every
    future it gets is waited on, as the SDK wants."""
    import re
    import warnings
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "tinker.md").read_text()
    snippet = re.search(r"```python\n(import tinker\n.*?)```", doc, re.S).group(1)
    monkeypatch.setenv("TINKER_BASE_URL", server.url)
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    tokenizer = training_client(service).get_tokenizer()
    tokens = tokenizer.encode("2+2=4")
    data = [types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": [-1.0] * (len(tokens) - 1),
                                        "advantages": [1.0] * (len(tokens) - 1)})]
    scope = {"data": data, "prompt": types.ModelInput.from_ints(tokenizer.encode("2+2="))}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(snippet.replace("/path/to/hf_model", MODEL), scope)
    assert scope["result"].sequences and "loss:sum" in scope["metrics"]
    sdk = [str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)]  # sockets: GC timing
    assert sdk == [], sdk
    scope["service"].close("success")
