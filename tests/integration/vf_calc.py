"""A tool-using verifiers taskset written with verifiers' own API (taskset id `vf_calc`, this module): the model adds
two numbers with the `calc_add` tool, a `vf.Toolset` that verifiers serves over MCP (this module, run as
`python -m vf_calc`, is the tool server) and its chat harness calls; the rubric checks the final reply."""

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class CalcConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class CalcData(vf.TaskData):
    answer: str


class CalcTask(vf.Task[CalcData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    @classmethod
    def toolsets(cls, config: CalcConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    def load(self) -> list[CalcTask]:
        return [CalcTask(CalcData(idx=i, prompt=f"{i}+40", answer=str(i + 40)), self.config.task) for i in range(4)]


__all__ = ["CalcTaskset"]

if __name__ == "__main__":   # verifiers starts the tool server as `python -m vf_calc`
    CalcToolset.run()
