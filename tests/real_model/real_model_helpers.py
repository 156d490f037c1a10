"""Helpers shared by tests/real_model (imported by name: pytest puts this folder on sys.path)."""


def chat_ids(tokenizer, question: str) -> list[int]:
    """Token ids of one user question through the tokenizer's own chat template, ready to answer."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]
