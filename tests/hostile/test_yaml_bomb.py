"""Issue 53, finding 8: a YAML anchor bomb in a free-form mapping (`reward.routes`) was expanded.

Eight levels of aliases under reward.routes ran 71-78 s when the config was printed and died with MemoryError at a
3 GB cap. Now configs take no YAML aliases: a recipe or an override with one is refused as it is read, in one line
that names the alias, before anything is printed or saved.
"""

import time

from grpoflow.cli import main


def bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for k in range(1, levels + 1):
        lines.append(f"a{k}: &a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]")
    return "reward:\n  routes:\n" + "".join(f"    {line}\n" for line in lines)


def test_an_anchor_bomb_under_reward_routes_is_refused_before_anything_is_printed(tmp_path, capsys):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(bomb(8))  # 9**9 strings once expanded
    began = time.perf_counter()
    assert main(["config", str(recipe)]) == 2
    assert time.perf_counter() - began < 5
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert f"Recipe {recipe} is not valid YAML: an alias (*a0): grpoflow configs take no YAML aliases" in err


def test_an_alias_in_a_recipe_or_an_override_is_refused(tmp_path, capsys):
    recipe = tmp_path / "small.yaml"
    recipe.write_text(bomb(1))
    assert main(["config", str(recipe)]) == 2
    assert main(["config", "reward.routes={a: &x [exact_match], b: *x}"]) == 2
    err = capsys.readouterr().err
    assert "an alias (*a0)" in err and "an alias (*x)" in err
