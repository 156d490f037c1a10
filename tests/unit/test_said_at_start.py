"""What a run chose by itself is named on its start-up lines (issue 52 item 7): the scorer `reward.function=auto`
gives each data_source, and, on a CPU with bf16 units running float32 by default, that bfloat16 is there and what it
was measured to buy. Pure functions on rows and cpuinfo text: milliseconds."""

from pathlib import Path

import pytest

from grpoflow.rewards.by_source import auto_scorers
from grpoflow.training.bf16_units import bf16_available_hint, cpu_bf16_flags

EPYC = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n"
ICE_LAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"


def test_auto_names_the_scorer_of_each_data_source_with_its_rows():
    rows = [{"data_source": "openai/gsm8k"}] * 3 + [{"data_source": "lighteval/MATH"}, {}, {}]
    assert auto_scorers(rows) == ("reward.function=auto scores by data_source: openai/gsm8k -> gsm8k (3 rows), "
                                  "(no data_source) -> exact_match (2 rows), lighteval/MATH -> math (1 row)")


def cpuinfo(tmp_path: Path, text: str) -> Path:
    (tmp_path / "cpuinfo").write_text(text)
    return tmp_path / "cpuinfo"


def test_the_bf16_flags_are_read_in_order(tmp_path):
    assert cpu_bf16_flags(cpuinfo(tmp_path, SAPPHIRE)) == ["avx512_bf16", "amx_bf16"]
    assert cpu_bf16_flags(cpuinfo(tmp_path, ICE_LAKE)) == [] and cpu_bf16_flags(tmp_path / "absent") == []


def test_a_default_float32_run_on_a_cpu_with_bf16_units_hears_of_bfloat16(tmp_path):
    line = bf16_available_hint(None, "float32", "cpu", cpuinfo(tmp_path, EPYC))
    assert line.startswith("this CPU has bf16 units (avx512_bf16): model.compute_dtype=bfloat16")
    assert "2.3x faster per step on SmolLM2-135M" in line and "docs/performance.md" in line


@pytest.mark.parametrize("setting, resolved, device, text", [
    ("float32", "float32", "cpu", EPYC),      # the user chose float32
    (None, "bfloat16", "cuda", EPYC),         # a GPU
    ("auto", "bfloat16", "cpu", EPYC),        # already bf16
    (None, "float32", "cpu", ICE_LAKE),       # no units: bf16 would be slower
])
def test_no_bf16_line_where_it_would_not_help_or_was_chosen(tmp_path, setting, resolved, device, text):
    assert bf16_available_hint(setting, resolved, device, cpuinfo(tmp_path, text)) is None


def test_the_figure_the_line_gives_is_the_one_docs_performance_md_holds():
    doc = (Path(__file__).parents[2] / "docs" / "performance.md").read_text()
    bf16 = next(r for r in doc.splitlines() if "AMD EPYC (avx512_bf16)" in r and "grpoflow bf16" in r)
    fp32 = next(r for r in doc.splitlines() if "AMD EPYC (avx512_bf16)" in r and "| grpoflow fp32 |" in r)
    seconds = [float(r.split("|")[5].strip(" *")) for r in (fp32, bf16)]
    assert f"{seconds[0] / seconds[1]:.1f}x" == "2.3x"
