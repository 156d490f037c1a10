// Run facts: the main settings, the batch schedule, progress, checkpoints, restarts and faults, files, and the
// resolved config.
"use strict";

function table(headers, rows) {
  return el("table", {class: "facts-table"},
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {text: h})))),
    el("tbody", {}, ...rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c ?? "–"))))));
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  if (seconds < 90) return `${seconds.toFixed(0)} s ago`;
  if (seconds < 5400) return `${(seconds / 60).toFixed(0)} min ago`;
  return `${(seconds / 3600).toFixed(1)} h ago`;
}

function runFacts(f) {
  const progress = `${f.last_step} of ${f.total_steps ?? "?"} steps trained; last write ${ago(f.last_write_s_ago)}`;
  return el("article", {class: "run-facts", "data-run": f.name},
    el("h2", {text: f.name}), el("p", {class: "path", text: f.path}),
    el("p", {class: "progress", text: progress}),
    f.schedule ? el("p", {class: "schedule", text: f.schedule}) : null,
    table(["setting", "value"], Object.entries(f.summary).map(([k, v]) => [k, typeof v === "object" ? JSON.stringify(v) : String(v)])),
    el("h3", {text: `checkpoints (${f.checkpoints.length})`}),
    f.checkpoints.length ? table(["folder", "step", "size", "written", ""], f.checkpoints.map((c) =>
      [c.name, String(c.step), bytes(c.bytes), new Date(c.time * 1000).toLocaleString(), c.latest ? "latest" : ""]))
      : el("p", {class: "empty", text: "none yet"}),
    el("h3", {text: `restarts and faults (${f.restarts.length})`}),
    f.restarts.length ? table(["restart", "during step", "role", "rank", "cause", "resumed from"], f.restarts.map((r) =>
      [String(r.restart), String(r.during_step), r.role, String(r.rank ?? ""), r.cause, r.checkpoint || "step 0"]))
      : el("p", {class: "empty", text: "none (restarts.jsonl is written when trainer.max_restarts rebuilds the workers)"}),
    el("h3", {text: "files"}),
    table(["name", "size"], f.files.map((x) => [x.name, bytes(x.bytes)])),
    el("details", {}, el("summary", {text: "resolved config (config.yaml)"}), el("pre", {class: "config", text: f.config_text})));
}

async function refreshFacts() {
  const all = await Promise.all(state.runs.map((r) => getJSON(`/api/runs/${r.id}/facts`)));
  const box = document.getElementById("facts");
  const open = [...box.querySelectorAll("details")].map((d) => d.open);
  box.replaceChildren(...all.map(runFacts));
  [...box.querySelectorAll("details")].forEach((d, i) => { if (open[i]) d.open = true; });
}
