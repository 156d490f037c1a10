"""The micro-batch budget chosen from memory (training/budget.py), against hand values."""

from types import SimpleNamespace

from grpoflow.training import budget

# SmolLM2-135M-Instruct's shape
SMOLLM2 = SimpleNamespace(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                          num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True)


def test_activation_bytes_per_token_by_hand():
    # one layer: 34 * 10 + 8 * 20 + 5 * 2 * 3 = 340 + 160 + 30 = 530 bytes in 16 bit; 2 layers 1,060; fp32 2,120
    assert budget.activation_bytes_per_token(layers=2, hidden=10, intermediate=20, heads=2, seq=3, act_bytes=2) == 1060
    assert budget.activation_bytes_per_token(layers=2, hidden=10, intermediate=20, heads=2, seq=3, act_bytes=4) == 2120


def test_token_budget_by_hand_and_its_clamps():
    # half of 2 GB = 1e9 bytes, minus 24 B x 1e7 parameters = 7.6e8 bytes, / 1e5 bytes a token = 7,600 -> 7,424
    # (a multiple of 256)
    assert budget.token_budget(memory_bytes=2e9, params=10**7, per_token=1e5) == 7424
    assert budget.token_budget(memory_bytes=2e8, params=10**7, per_token=1e5) == budget.MIN_TOKENS  # too little room
    assert budget.token_budget(memory_bytes=1e13, params=10**7, per_token=1e5) == budget.MAX_TOKENS


def test_estimated_params_of_smollm2():
    # per layer: q and o 576 x 576 each, k and v 576 x 192 each, gate / up / down 576 x 1536: 3,538,944;
    # 30 layers + the tied 49,152 x 576 embedding = 134,479,872 (the real model: 134,515,008 with its norms)
    assert budget.estimated_params(SMOLLM2) == 134_479_872


def test_smollm2_on_a_24_gib_machine():
    # bf16, sequences <= 512 + 24: 30 x (34 x 576 + 8 x 1536 + 5 x 9 x 536) = 30 x 55,992 bytes a token = 1.68 MB;
    # (0.5 x 24 GiB - 24 x 134.5M) / 1.68 MB = (12.88e9 - 3.23e9) / 1.68e6 = 5,746 -> 5,632: one micro-batch holds
    # the real-model row's step (64 x 70 = 4,480 padded tokens); float32 activations need twice that: the floor
    got = budget.auto_token_budget(SMOLLM2, params=134_479_872, seq=536, compute_dtype="bfloat16",
                                   memory_bytes=24 * 2 ** 30)
    assert got == 5632
    assert budget.auto_token_budget(SMOLLM2, params=134_479_872, seq=536, compute_dtype="float32",
                                    memory_bytes=24 * 2 ** 30) == budget.MIN_TOKENS


def test_a_configured_budget_is_kept_and_a_missing_config_takes_the_floor(tmp_path, tiny_model_path):
    assert budget.microbatch_budget(777, model_path=str(tmp_path), seq=100, compute_dtype="float32") == 777
    assert budget.microbatch_budget(0, model_path=str(tmp_path), seq=100, compute_dtype="float32") == budget.MIN_TOKENS
    # never less than one sequence (data.max_prompt_length + rollout.max_new_tokens)
    assert budget.microbatch_budget(0, model_path=str(tmp_path), seq=9000, compute_dtype="float32") == 9000
    # the tiny model is small: a 1 TB machine gives the cap
    assert budget.microbatch_budget(0, model_path=tiny_model_path, seq=100, compute_dtype="float32",
                                    memory_bytes=10**12) == budget.MAX_TOKENS


def test_ranks_elsewhere_take_the_floor_not_this_machines_memory(tiny_model_path):
    # backend=ray: the ranks may sit on GPUs of other machines; a budget sized for the controller's RAM could not fit
    assert budget.microbatch_budget(0, model_path=tiny_model_path, seq=100, compute_dtype="float32",
                                    memory_bytes=10**12, ranks_here=False) == budget.MIN_TOKENS
    assert budget.microbatch_budget(0, model_path=tiny_model_path, seq=9000, compute_dtype="float32",
                                    ranks_here=False) == 9000
    assert budget.microbatch_budget(777, model_path=tiny_model_path, seq=100, compute_dtype="float32",
                                    ranks_here=False) == 777


def test_machine_memory_is_this_machines():
    import os
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 2 ** 28 < budget.machine_memory_bytes() <= ram
