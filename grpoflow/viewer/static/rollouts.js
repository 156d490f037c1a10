// Rollouts: pick a run and a step, see its groups (prompt, each sample's completion, reward, advantage, length,
// the group's mean and spread); sort, filter by reward, data source or signal, search; multi-turn samples turn by
// turn, with the tokens the update did not train marked.
"use strict";

// `view` counts the user's choices of run, kind and step. A refresh or load that was asked for before the latest
// choice drops its answer after the await: otherwise a slow one (the poll's, or the tab click's) renders the step
// list of one run and then loads another run's groups at a step that run does not have (an empty page).
const ro = {steps: {train: [], val: []}, groups: [], loaded: null, view: 0};
const $ = (id) => document.getElementById(id);

function initRollouts() {
  $("ro-run").replaceChildren(...state.runs.map((r) => el("option", {value: r.id, text: r.name})));
  for (const id of ["ro-run", "ro-kind"]) {
    $(id).addEventListener("change", () => { ro.view++; ro.loaded = null; refreshRollouts(true); });
  }
  $("ro-step").addEventListener("change", () => { ro.view++; $("ro-follow").checked = false; loadGroups(); });
  $("ro-prev").addEventListener("click", () => moveStep(-1));
  $("ro-next").addEventListener("click", () => moveStep(1));
  for (const id of ["ro-sort", "ro-source", "ro-signal", "ro-min", "ro-max", "ro-search"]) {
    $(id).addEventListener("input", renderGroups);
  }
}

function moveStep(delta) {
  const select = $("ro-step");
  const i = select.selectedIndex + delta;
  if (i < 0 || i >= select.options.length) return;
  select.selectedIndex = i;
  ro.view++;
  $("ro-follow").checked = false;
  loadGroups();
}

async function refreshRollouts(force = false) {
  const run = Number($("ro-run").value || 0);
  const kind = $("ro-kind").value;
  const view = ro.view;
  const allSteps = await getJSON(`/api/runs/${run}/steps`);
  if (view !== ro.view) return;             // the user picked another run or kind meanwhile: that refresh renders
  ro.steps = allSteps;
  const steps = ro.steps[kind];
  const select = $("ro-step");
  const before = select.value;
  if (steps.length !== select.options.length || force) {
    select.replaceChildren(...steps.map((s) => el("option", {value: s, text: s})));
    select.value = steps.includes(Number(before)) ? before : String(steps[steps.length - 1] ?? "");
  }
  if ($("ro-follow").checked && steps.length) select.value = String(steps[steps.length - 1]);
  if (!steps.length) {
    ro.groups = [];
    $("groups").replaceChildren(el("p", {class: "empty", text: kind === "train"
      ? "No training groups yet (train_samples.jsonl; trainer.log_train_every > 0 writes them)."
      : "No validation samples yet (samples.jsonl)."}));
    return;
  }
  if (ro.loaded !== `${run}/${kind}/${select.value}`) await loadGroups();
}

async function loadGroups() {
  const run = Number($("ro-run").value || 0), kind = $("ro-kind").value, step = $("ro-step").value;
  if (step === "") return;
  const view = ro.view;
  const data = await getJSON(`/api/runs/${run}/groups?kind=${kind}&step=${step}`);
  if (view !== ro.view) return;             // asked for before the user's latest choice
  ro.groups = data.groups;
  ro.loaded = `${run}/${kind}/${step}`;
  const sources = [...new Set(ro.groups.map((g) => g.data_source))].sort();
  const source = $("ro-source");
  const keep = source.value;
  source.replaceChildren(el("option", {value: "", text: "all"}), ...sources.map((s) => el("option", {value: s, text: s})));
  source.value = sources.includes(keep) ? keep : "";
  renderGroups();
}

function sampleText(s) {
  const parts = [s.completion || ""];
  for (const m of s.conversation || []) parts.push(typeof m.content === "string" ? m.content : JSON.stringify(m.content));
  return parts.join("\n").toLowerCase();
}

function visibleGroups() {
  const query = $("ro-search").value.trim().toLowerCase();
  const lo = $("ro-min").value === "" ? -Infinity : Number($("ro-min").value);
  const hi = $("ro-max").value === "" ? Infinity : Number($("ro-max").value);
  const source = $("ro-source").value, signal = $("ro-signal").value;
  let groups = ro.groups.filter((g) => (!source || g.data_source === source)
    && (!signal || (signal === "signal") === g.std > 0));
  const unfiltered = !query && lo === -Infinity && hi === Infinity;
  groups = groups.map((g) => ({...g, shown: g.samples.map((s, i) => ({...s, index: i})).filter((s) =>
    (s.score === null ? lo === -Infinity && hi === Infinity : s.score >= lo && s.score <= hi)
    && (!query || sampleText(s).includes(query) || (g.prompt || "").toLowerCase().includes(query)))}))
    .filter((g) => g.shown.length || (unfiltered && !g.samples.length));  // an empty group shows its note
  const sort = $("ro-sort").value;
  if (sort === "mean-desc") groups.sort((a, b) => b.mean - a.mean);
  else if (sort === "mean-asc") groups.sort((a, b) => a.mean - b.mean);
  else if (sort === "std-desc") groups.sort((a, b) => b.std - a.std);
  return groups;
}

function highlighted(text, query) {
  text = text ?? "";
  if (!query) return [text];
  const out = [];
  const lower = text.toLowerCase();
  let at = 0;
  for (let i = lower.indexOf(query); i >= 0; i = lower.indexOf(query, at)) {
    out.push(text.slice(at, i), el("mark", {text: text.slice(i, i + query.length)}));
    at = i + query.length;
  }
  out.push(text.slice(at));
  return out;
}

function rewardClass(score, group) {
  if (group.std === 0 || score === null) return "flat";
  return score > group.mean ? "above" : score < group.mean ? "below" : "flat";
}

function renderGroups() {
  const groups = visibleGroups();
  const samples = groups.reduce((n, g) => n + g.shown.length, 0);
  const total = ro.groups.reduce((n, g) => n + g.samples.length, 0);
  $("ro-summary").textContent = `step ${$("ro-step").value}: ${groups.length} of ${ro.groups.length} groups, `
    + `${samples} of ${total} samples shown`;
  const query = $("ro-search").value.trim().toLowerCase();
  $("groups").replaceChildren(...groups.map((g) => groupCard(g, query)));
}

function groupCard(g, query) {
  const facts = Object.entries(g.row || {}).filter(([k]) => k !== "data_source").map(([k, v]) => `${k}: ${v}`).join(" · ");
  return el("article", {class: "group", "data-group": g.group, "data-mean": g.mean},
    el("header", {},
      el("b", {text: `group ${g.group}`}), ` · ${g.data_source} · `,
      el("span", {class: "stat", text: `reward mean ${fmt(g.mean)} ± ${fmt(g.std)} (n=${g.samples.length})`}),
      facts ? el("span", {class: "row-facts", text: ` · ${facts}`}) : null),
    g.note ? el("p", {class: "note", text: g.note}) : null,
    el("pre", {class: "prompt"}, ...highlighted(g.prompt, query)),
    el("table", {class: "samples"},
      el("thead", {}, el("tr", {}, ...["#", "reward", "advantage", "length", "version", "", "completion"]
        .map((h) => el("th", {text: h})))),
      el("tbody", {}, ...g.shown.map((s) => sampleRow(s, g, query)))));
}

function sampleRow(s, g, query) {
  const parts = Object.entries(s.reward_parts || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  const adv = s.advantage;
  return el("tr", {class: `sample ${rewardClass(s.score, g)}`},
    el("td", {text: s.index}),
    el("td", {class: "num"}, fmt(s.score), parts ? el("div", {class: "parts", text: parts}) : null),
    el("td", {class: `num ${adv > 0 ? "pos" : adv < 0 ? "neg" : ""}`, text: adv === undefined ? "–" : fmt(adv)}),
    el("td", {class: "num", text: s.length === undefined ? "–"
      : s.trained_tokens !== undefined && s.trained_tokens !== s.length ? `${s.length} (${s.trained_tokens} trained)`
      : s.length}),
    el("td", {class: "num", text: s.policy_version ?? "–"}),
    el("td", {}, s.truncated ? el("span", {class: "cut", title: "hit the token budget before it ended", text: "✂ cut"})
      : ["error", "timeout", "max_turns"].includes(s.ended) ? el("span", {class: "cut", title: "why it ended", text: s.ended})
      : null),
    el("td", {class: "completion"}, ...sampleBody(s, query)));
}

function sampleBody(s, query) {
  const out = [];
  if (s.conversation) out.push(conversationView(s.conversation, query));
  else out.push(el("pre", {class: "text"}, ...highlighted(s.completion, query)));
  if (s.conversation && s.truncated) out.push(el("div", {class: "cut-line", text: "✂ the token budget ran out here"}));
  if (s.segments) out.push(segmentsView(s));
  return out;
}

function conversationView(messages, query) {
  let turn = 0;
  return el("ol", {class: "conversation"}, ...messages.map((m) => {
    const role = m.role || "?";
    const label = role === "assistant" ? `model turn ${++turn}` : role === "tool" ? `tool${m.name ? ` ${m.name}` : ""} result`
      : role === "user" && turn > 0 ? "environment" : role;
    const content = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
    const calls = m.tool_calls ? el("pre", {class: "tool-calls", text: JSON.stringify(m.tool_calls)}) : null;
    return el("li", {class: `msg ${role}`}, el("span", {class: "role", text: label}),
      el("pre", {class: "text"}, ...highlighted(content, query)), calls);
  }));
}

function segmentsView(s) {
  const spans = s.segments.map((seg) => el("span", {
    class: `seg ${seg.source} ${seg.trained ? "trained" : "untrained"}`,
    title: `${seg.tokens} tokens, ${seg.source === "model" ? "the model's" : "the environment's"}, `
      + (seg.trained ? "trained" : "not trained"), text: seg.text}));
  if (s.truncated) spans.push(el("span", {class: "cut", text: "✂ budget"}));
  return el("details", {class: "tokens", open: !s.conversation},
    el("summary", {text: `response tokens: trained / not trained (${s.trained_tokens} trained)`}),
    el("pre", {class: "segments"}, ...spans));
}
