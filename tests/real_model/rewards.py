"""A reward the 135M model can learn within a few steps: answer an arithmetic question starting with a
digit (greedy it often does, "7 + 5 = 12", but sampled answers start with "The answer", "To solve" ...)."""


def starts_with_digit(prompt: str, completion: str, **row) -> float:
    return float(completion.lstrip()[:1].isdigit())
