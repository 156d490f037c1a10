// Curves: any metric against step (Plotly), one trace per run, validation steps marked, and the step's timing
// breakdown (timing_s/*) stacked, one chart per run.
"use strict";

const DEFAULT_METRICS = ["critic/score/mean", "val/mean@1", "response_length/mean", "actor/entropy",
  "actor/pg_loss", "actor/kl_loss", "mismatch/abs_log_ratio_mean", "perf/throughput"];
// stages that split a step's wall time (others overlap them: gen_busy, dispatch, rollout_wait)
const STAGES = ["gen", "trainer_wait", "reward", "gen_baseline", "old_log_prob", "ref", "values", "adv",
  "update_critic", "update_actor", "sync"];
// not stages of the step's sum: the whole step, the engines' own time, overheads, and the actor's model math
// inside update_actor
const OVERLAPPING = new Set(["step", "gen_busy", "dispatch", "rollout_wait", "train_forward", "forward_backward",
                             "optimizer"]);
const TIMING = "timing breakdown (timing_s/*, stacked)";
const selected = new Set();
let chosenByUser = false;

function metricKeys() {
  const keys = new Set();
  for (const run of state.runs) for (const r of run.records) for (const k of Object.keys(r)) keys.add(k);
  keys.delete("step");
  return [...keys].sort();
}

function validationSteps(run) {
  return run.records.filter((r) => Object.keys(r).some((k) => k.startsWith("val/"))).map((r) => r.step);
}

function renderMetricList(keys) {
  if (!chosenByUser) {
    for (const k of DEFAULT_METRICS) if (keys.includes(k)) selected.add(k);
    if (keys.some((k) => k.startsWith("timing_s/"))) selected.add(TIMING);
  }
  const filter = document.getElementById("metric-filter").value.trim().toLowerCase();
  const items = [TIMING, ...keys].filter((k) => !filter || k.toLowerCase().includes(filter));
  const list = document.getElementById("metric-list");
  list.replaceChildren(...items.map((k) => el("label", {class: "metric", title: k},
    el("input", {type: "checkbox", checked: selected.has(k), "data-metric": k, onchange: (e) => {
      chosenByUser = true;
      if (e.target.checked) selected.add(k); else selected.delete(k);
      renderCurves(true);
    }}), k)));
}

function chartDiv(key, runId = null) {
  const id = `chart-${key}${runId === null ? "" : `-run${runId}`}`.replace(/[^A-Za-z0-9_-]/g, "_");
  return document.getElementById(id)
    || el("div", {id, class: "chart", "data-metric": key, ...(runId === null ? {} : {"data-run": runId})});
}

function metricChart(key, shown, div) {
  const isVal = key.startsWith("val/");
  const traces = shown.map((run) => {
    const points = run.records.filter((r) => r[key] !== undefined && r[key] !== null);
    return {x: points.map((r) => r.step), y: points.map((r) => r[key]), name: run.name, type: "scatter",
      mode: isVal || points.length < 3 ? "lines+markers" : "lines",
      line: {color: runColor(run.id), width: 1.5}, marker: {size: isVal ? 8 : 4, symbol: isVal ? "diamond" : "circle"}};
  });
  // validation steps of the shown runs, as dotted vertical lines (a validation curve shows its own points)
  const valSteps = isVal ? [] : [...new Set(shown.flatMap(validationSteps))];
  const shapes = valSteps.map((s) => ({type: "line", xref: "x", yref: "paper", x0: s, x1: s, y0: 0, y1: 1,
    line: {color: "#999", width: 1, dash: "dot"}}));
  div.dataset.points = String(traces.reduce((n, t) => n + t.x.length, 0));
  const layout = {title: {text: key, font: {size: 13}}, margin: {l: 55, r: 15, t: 35, b: 35}, height: 260,
    shapes, showlegend: shown.length > 1, legend: {orientation: "h", y: -0.2}, xaxis: {title: {text: "step"}},
    hovermode: "x unified", uirevision: key};
  Plotly.react(div, traces, layout, {displaylogo: false, responsive: true});
}

function timingChart(run, div) {
  const stageKeys = new Set();
  for (const r of run.records) for (const k of Object.keys(r)) {
    if (k.startsWith("timing_s/") && !OVERLAPPING.has(k.slice(9))) stageKeys.add(k.slice(9));
  }
  const order = [...STAGES.filter((s) => stageKeys.has(s)), ...[...stageKeys].filter((s) => !STAGES.includes(s)).sort()];
  const steps = run.records.filter((r) => r["timing_s/step"] !== undefined);
  const x = steps.map((r) => r.step);
  const traces = order.map((s) => ({x, y: steps.map((r) => r[`timing_s/${s}`] || 0), name: s, type: "scatter",
    mode: "lines", stackgroup: "stages", line: {width: 0.5}}));
  traces.push({x, name: "other", type: "scatter", mode: "lines", stackgroup: "stages", line: {width: 0.5},
    y: steps.map((r) => Math.max(0, r["timing_s/step"] - order.reduce((a, s) => a + (r[`timing_s/${s}`] || 0), 0)))});
  traces.push({x, y: steps.map((r) => r["timing_s/step"]), name: "step (total)", type: "scatter", mode: "lines",
    line: {color: "#000", width: 1, dash: "dot"}});
  div.dataset.points = String(x.length);
  const layout = {title: {text: `seconds per step by stage: ${run.name}`, font: {size: 13}}, height: 300,
    margin: {l: 55, r: 15, t: 35, b: 35}, xaxis: {title: {text: "step"}}, yaxis: {title: {text: "s"}},
    hovermode: "x unified", uirevision: `timing-${run.id}`};
  Plotly.react(div, traces, layout, {displaylogo: false, responsive: true});
}

function renderCurves(changed) {
  const charts = document.getElementById("charts");
  if (!changed && charts.childElementCount) return;
  const keys = metricKeys();
  renderMetricList(keys);
  const shown = state.runs.filter((r) => r.shown);
  if (!keys.length) {
    charts.replaceChildren(el("p", {class: "empty", text: "No metrics yet: metrics.jsonl is empty or missing."}));
    return;
  }
  const specs = [];   // [div, draw]: divs go into the page first, so that Plotly sizes each to its grid cell
  for (const key of [...selected]) {
    if (key === TIMING) specs.push(...shown.map((run) => [chartDiv(TIMING, run.id), (div) => timingChart(run, div)]));
    else if (keys.includes(key)) specs.push([chartDiv(key), (div) => metricChart(key, shown, div)]);
  }
  const divs = specs.map(([div]) => div);
  // keep chart nodes (Plotly state) and only reorder: replaceChildren would reset their zoom
  for (const child of [...charts.children]) if (!divs.includes(child)) child.remove();
  divs.forEach((div, i) => { if (charts.children[i] !== div) charts.insertBefore(div, charts.children[i] || null); });
  for (const [div, draw] of specs) draw(div);
}

document.getElementById("metric-filter").addEventListener("input", () => renderMetricList(metricKeys()));
