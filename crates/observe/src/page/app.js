// The live page: keeps the nodes, services and tasks from /live (a snapshot, then deltas with their store
// index) and redraws at most every RENDER_MS. Read-only: it only ever GETs /live.
"use strict";

const RENDER_MS = 200;
// A service with more tasks than this on one node is drawn as one card with counts per state.
const CARDS_PER_SERVICE_AND_NODE = 8;
// Failed tasks drawn per service and node (the newest by slot).
const FAILED_PER_SERVICE_AND_NODE = 3;

const page = { index: 0, nodes: new Map(), services: new Map(), tasks: new Map(), tasksTotal: 0, renders: 0 };
window.shoalPage = page;

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function hue(text) {
  let h = 0;
  for (const ch of text) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return h % 360;
}

function serviceColor(id) {
  const s = page.services.get(id);
  return `hsl(${hue(s ? s.name : id)}, 62%, 46%)`;
}

function applySnapshot(snap) {
  page.index = snap.index;
  page.nodes = new Map(snap.nodes.map((n) => [n.id, n]));
  page.services = new Map(snap.services.map((s) => [s.id, s]));
  page.tasks = new Map(snap.tasks.map((t) => [t.id, t]));
  page.tasksTotal = snap.tasks_total;
  page.capped = snap.tasks.length < snap.tasks_total;
}

function applyDelta(delta) {
  if (delta.index <= page.index) return;
  page.index = delta.index;
  for (const c of delta.changes) {
    switch (c.kind) {
      case "node": page.nodes.set(c.id, c); break;
      case "service": page.services.set(c.id, c); break;
      case "task": page.tasks.set(c.id, c); break;
      case "gone": {
        const table = { node: page.nodes, service: page.services, task: page.tasks }[c.of];
        if (table) table.delete(c.id);
        if (c.of === "service") for (const [id, t] of page.tasks) if (t.service_id === c.id) page.tasks.delete(id);
        break;
      }
    }
  }
}

function serviceName(id) {
  const s = page.services.get(id);
  return s ? s.name : id.slice(0, 10);
}

function isFailed(t) { return t.state === "failed" || t.state === "rejected"; }

function taskCard(t) {
  const s = page.services.get(t.service_id);
  const label = s && (s.mode === "global" || s.mode === "global-job") ? serviceName(t.service_id) : `${serviceName(t.service_id)}.${t.slot}`;
  // Why a task waits (the scheduler's reason) or failed (its error); other states need no explanation.
  const why = t.state === "pending" || isFailed(t) ? t.err || t.message : t.err;
  return `<div class="task ${esc(t.state)}" data-task-id="${esc(t.id)}" data-service-name="${esc(serviceName(t.service_id))}" style="border-left-color:${serviceColor(t.service_id)}">
    <div class="name">${esc(label)}</div>
    <div class="state">${esc(t.state)}${t.desired !== "running" && t.desired !== t.state ? ` → ${esc(t.desired)}` : ""}</div>
    ${why ? `<div class="why">${esc(why)}</div>` : ""}
  </div>`;
}

function groupCard(serviceId, tasks) {
  const counts = new Map();
  for (const t of tasks) counts.set(t.state, (counts.get(t.state) || 0) + 1);
  const parts = [...counts].sort((a, b) => b[1] - a[1]).map(([st, n]) => `${n} ${esc(st)}`).join(", ");
  const name = serviceName(serviceId);
  return `<div class="task group" data-service-name="${esc(name)}" data-count="${tasks.length}" style="border-left-color:${serviceColor(serviceId)}">
    <div class="name">${esc(name)} × ${tasks.length}</div>
    <div class="state">${parts}</div>
  </div>`;
}

function tasksHtml(tasks) {
  const byService = new Map();
  for (const t of tasks) {
    if (!byService.has(t.service_id)) byService.set(t.service_id, []);
    byService.get(t.service_id).push(t);
  }
  const ids = [...byService.keys()].sort((a, b) => serviceName(a).localeCompare(serviceName(b)));
  let html = "";
  for (const id of ids) {
    const list = byService.get(id).sort((a, b) => a.slot - b.slot || a.id.localeCompare(b.id));
    const failed = list.filter(isFailed).slice(-FAILED_PER_SERVICE_AND_NODE);
    const live = list.filter((t) => !isFailed(t));
    if (live.length > CARDS_PER_SERVICE_AND_NODE) html += groupCard(id, live);
    else html += live.map(taskCard).join("");
    html += failed.map(taskCard).join("");
  }
  return html;
}

function nodeColumn(n, tasks) {
  const badges = [n.role === "manager" ? `<span class="badge">manager</span>` : "", n.leader ? `<span class="badge leader">leader</span>` : ""].join("");
  const availability = n.availability !== "active" ? ` · ${esc(n.availability)}` : "";
  return `<div class="node ${esc(n.state)}" data-node-id="${esc(n.id)}" data-node-state="${esc(n.state)}">
    <div class="node-head">
      <div class="node-name">${esc(n.hostname || n.id)}${badges}</div>
      <div class="node-meta"><span class="state">${esc(n.state)}</span>${availability} · ${tasks.length} task${tasks.length === 1 ? "" : "s"}</div>
    </div>
    <div class="tasks">${tasksHtml(tasks)}</div>
  </div>`;
}

function render() {
  page.renders++;
  const byNode = new Map();
  const unassigned = [];
  for (const t of page.tasks.values()) {
    if (!t.node_id) { unassigned.push(t); continue; }
    if (!byNode.has(t.node_id)) byNode.set(t.node_id, []);
    byNode.get(t.node_id).push(t);
  }
  const nodes = [...page.nodes.values()].sort((a, b) => (a.hostname || a.id).localeCompare(b.hostname || b.id));
  let html = nodes.map((n) => nodeColumn(n, byNode.get(n.id) || [])).join("");
  if (unassigned.length) {
    html += `<div class="node pending-col" data-node-id="">
      <div class="node-head"><div class="node-name">Not assigned</div><div class="node-meta">${unassigned.length} task${unassigned.length === 1 ? "" : "s"} waiting for a node</div></div>
      <div class="tasks">${tasksHtml(unassigned)}</div>
    </div>`;
  }
  document.getElementById("nodes").innerHTML = html;

  const running = new Map();
  const complete = new Map();
  for (const t of page.tasks.values()) {
    if (t.state === "running" && t.desired === "running") running.set(t.service_id, (running.get(t.service_id) || 0) + 1);
    if (t.state === "complete") complete.set(t.service_id, (complete.get(t.service_id) || 0) + 1);
  }
  const services = [...page.services.values()].sort((a, b) => a.name.localeCompare(b.name));
  document.querySelector("#services tbody").innerHTML = services.map((s) => {
    const jobs = s.mode.endsWith("job");
    const done = jobs ? complete.get(s.id) || 0 : running.get(s.id) || 0;
    const wanted = s.replicas ?? (jobs ? "" : nodes.filter((n) => n.state === "ready" && n.availability === "active").length);
    const tasks = jobs ? `${done}${wanted !== "" ? `/${wanted}` : ""} complete` : `${done}/${wanted} running`;
    return `<tr data-service-name="${esc(s.name)}"><td><span class="swatch" style="background:${serviceColor(s.id)}"></span>${esc(s.name)}</td><td>${esc(s.mode)}</td><td class="count">${tasks}</td><td>${esc(s.image)}</td></tr>`;
  }).join("");
  document.getElementById("no-services").hidden = services.length > 0;
  const capped = document.getElementById("capped");
  capped.hidden = !page.capped;
  capped.textContent = page.capped ? `Showing ${page.tasks.size} of ${page.tasksTotal} tasks (the page's snapshot is capped).` : "";
  const down = nodes.filter((n) => n.state !== "ready").length;
  document.getElementById("summary").textContent =
    `${nodes.length} node${nodes.length === 1 ? "" : "s"}${down ? ` (${down} not ready)` : ""} · ${services.length} service${services.length === 1 ? "" : "s"} · ${page.tasks.size} task${page.tasks.size === 1 ? "" : "s"} · index ${page.index}`;
}

let renderTimer = null;
function scheduleRender() {
  if (renderTimer) return;
  renderTimer = setTimeout(() => { renderTimer = null; render(); }, RENDER_MS);
}

function setConn(cls, text) {
  const el = document.getElementById("conn");
  el.className = `conn ${cls}`;
  el.textContent = text;
}

function connect() {
  const source = new EventSource("live");
  source.addEventListener("snapshot", (e) => { applySnapshot(JSON.parse(e.data)); setConn("live", "live"); scheduleRender(); });
  source.addEventListener("delta", (e) => { applyDelta(JSON.parse(e.data)); scheduleRender(); });
  // EventSource reconnects by itself; the server sends a fresh snapshot on every connection.
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) {
      // Refused (e.g. too many pages open) or gone: try again a little later.
      setConn("lost", "disconnected");
      setTimeout(connect, 3000);
    } else {
      setConn("connecting", "reconnecting");
    }
  };
  source.onopen = () => setConn("live", "live");
}

render();
connect();
