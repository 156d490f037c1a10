// grpoflow view: the page's state, tabs and the polling loop that follows runs while they train.
// curves.js, rollouts.js and facts.js each render one tab from `state`.
"use strict";

const state = {
  runs: [],          // {id, name, path, records: [], count, generation, shown}
  refreshS: 2,
  tab: "curves",
  lastUpdate: null,
};

async function getJSON(url) {
  const response = await fetch(url, {cache: "no-store"});
  if (!response.ok) throw new Error(`${url}: ${response.status} ${await response.text()}`);
  return response.json();
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  return Math.abs(value) >= 1000 || (Math.abs(value) < 1e-3 && value !== 0) ? value.toExponential(2)
    : value.toFixed(digits);
}

function setStatus(text, isError = false) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.classList.toggle("error", isError);
}

// ---------------------------------------------------------------- tabs and runs

function showTab(name) {
  state.tab = name;
  for (const button of document.querySelectorAll("#tabs button")) {
    button.classList.toggle("active", button.dataset.tab === name);
  }
  for (const section of document.querySelectorAll("main > section")) {
    section.hidden = section.id !== `tab-${name}`;
  }
  renderTab(true);
}

function renderTab(changed) {
  if (state.tab === "curves") renderCurves(changed);
  else if (state.tab === "rollouts") refreshRollouts();
  else refreshFacts();
}

function renderRunToggles() {
  const box = document.getElementById("run-toggles");
  box.replaceChildren(...state.runs.map((run) => el("label", {class: "run-toggle", title: run.path},
    el("input", {type: "checkbox", checked: run.shown, onchange: (e) => {
      run.shown = e.target.checked;
      renderCurves(true);
    }}),
    el("span", {class: "swatch", style: `background:${runColor(run.id)}`}), run.name)));
}

function runColor(i) {
  const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  return palette[i % palette.length];
}

// ---------------------------------------------------------------- polling

async function pollMetrics(run) {
  const data = await getJSON(`/api/runs/${run.id}/metrics?count=${run.count}&generation=${run.generation}`);
  if (data.reset) run.records = [];
  run.records.push(...data.records);
  run.count = data.count;
  run.generation = data.generation;
  return data.reset || data.records.length > 0;
}

async function poll() {
  try {
    const changed = (await Promise.all(state.runs.map(pollMetrics))).some(Boolean);
    state.lastUpdate = new Date();
    setStatus(`updated ${state.lastUpdate.toLocaleTimeString()}`);
    if (state.tab === "curves") renderCurves(changed);
    else renderTab(false);
  } catch (error) {
    setStatus(`cannot reach the viewer: ${error.message}`, true);
  }
  setTimeout(poll, state.refreshS * 1000);
}

async function start() {
  const data = await getJSON("/api/runs");
  state.refreshS = data.refresh_s;
  state.runs = data.runs.map((r) => ({...r, records: [], count: 0, generation: -1, shown: true}));
  for (const button of document.querySelectorAll("#tabs button")) {
    button.addEventListener("click", () => showTab(button.dataset.tab));
  }
  renderRunToggles();
  initRollouts();
  await poll();
}

start().catch((error) => setStatus(`the viewer did not start: ${error.message}`, true));
