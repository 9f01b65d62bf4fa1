// stompbroker web console: every second it sends DIAG queries over STOMP on the broker's own
// WebSocket, turns the cumulative counters into rates and draws them with uPlot.
"use strict";

(function () {
  const QUERIES = ["session", "totals", "stale", "queues", "writers", "process", "latency", "cluster"];
  const KEEP = 300;          // samples kept: five minutes at one per second
  const MAX_QUEUE_SERIES = 10;
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                   "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#843c39"];
  const BINARY_INCRS = [];   // memory ticks at round binary sizes: 1 KiB, 2 KiB, 4 KiB ...
  for (let i = 10; i < 50; i++) BINARY_INCRS.push(2 ** i);
  const ROLE_ORDER = ["supervisor", "reader", "dispatcher"];

  const meta = (name) => (document.querySelector(`meta[name="${name}"]`) || {}).content || "";
  const $ = (id) => document.getElementById(id);

  // -- formatting -------------------------------------------------------------------------------
  function si(v, digits = 1) {
    if (v == null || isNaN(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(digits) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(digits) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(digits) + "k";
    if (a >= 100 || Number.isInteger(v)) return Math.round(v).toString();
    return v.toFixed(digits);
  }
  function bytes(v) {
    if (v == null || isNaN(v)) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(v >= 10 ? 0 : 1) : Math.round(v)) + " " + units[i];
  }
  function ms(v) {
    if (v == null || isNaN(v)) return "–";
    if (v === 0) return "0 ms";
    if (v >= 1000) return (v / 1000).toFixed(2) + " s";
    if (v >= 10) return v.toFixed(0) + " ms";
    return v.toFixed(v >= 1 ? 1 : 2) + " ms";
  }
  const pct = (v) => (v == null || isNaN(v) ? "–" : v === 0 ? "0 %" : v.toFixed(v >= 10 ? 0 : 1) + " %");
  function duration(s) {
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + (s % 60) + "s";
  }

  // -- colours: one per process, the same in every chart ------------------------------------------
  const colourOf = {};
  function roleColour(role) {
    if (!(role in colourOf)) {
      const fixed = ROLE_ORDER.indexOf(role);
      const writer = /^writer-(\d+)$/.exec(role);
      const index = fixed >= 0 ? fixed : writer ? 3 + Number(writer[1]) : 3 + Object.keys(colourOf).length;
      colourOf[role] = PALETTE[index % PALETTE.length];
    }
    return colourOf[role];
  }

  // -- charts -----------------------------------------------------------------------------------
  const charts = {};
  function chartWidth(el) { return Math.max(280, el.parentElement.clientWidth - 16); }

  // spec: {id, series: [{label, colour, values: []}], format: fn, min?: 0, max?}
  function draw(spec) {
    const el = $(spec.id);
    const labels = spec.series.map((s) => s.label).join("\u0000");
    let chart = charts[spec.id];
    const data = [times.slice(), ...spec.series.map((s) => s.values.slice())];
    if (chart && chart.labels === labels) {
      chart.plot.setData(data);
      showLatest(chart.plot);
      return;
    }
    if (chart) chart.plot.destroy();
    const opts = {
      width: chartWidth(el), height: 190,
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true, range: (u, lo, hi) => [Math.min(lo, hi - 60), hi] }, y: { range: (u, lo, hi) => [Math.min(0, lo), Math.max(hi * 1.1, spec.floor || 1)] } },
      axes: [
        { stroke: "#444", grid: { stroke: "#eee" } },
        Object.assign({ stroke: "#444", grid: { stroke: "#eee" }, size: 78, values: (u, ticks) => ticks.map((v) => spec.format(v)) },
                      spec.incrs ? { incrs: spec.incrs } : {}),
      ],
      series: [{ label: "time", value: (u, v) => (v == null ? "–" : new Date(v * 1000).toLocaleTimeString()) }]
        .concat(spec.series.map((s) => ({
          label: s.label, stroke: s.colour, width: 2, points: { show: false },
          value: (u, v) => (v == null ? "–" : spec.format(v)),
        }))),
    };
    charts[spec.id] = { plot: new uPlot(opts, data, el), labels };
    showLatest(charts[spec.id].plot);
  }
  // The legend shows the newest values unless the pointer is over the chart.
  function showLatest(plot) {
    if (plot.cursor.left == null || plot.cursor.left < 0) plot.setLegend({ idx: times.length - 1 });
  }
  window.addEventListener("resize", () => {
    for (const id in charts) charts[id].plot.setSize({ width: chartWidth($(id)), height: 190 });
  });

  // -- samples ----------------------------------------------------------------------------------
  const times = [];                 // epoch seconds of each sample (the browser's clock)
  const series = {};                // name -> values aligned with times
  let previous = null;              // the last sample's raw figures, for rates
  const streamSeen = {};            // stream -> {stored, time, rate}: a node reads its streams every 5 s
  let last = null;

  function push(name, value) {
    let values = series[name];
    if (!values) values = series[name] = new Array(times.length - 1).fill(null);
    values.push(value == null || isNaN(value) ? null : value);
  }
  function trim() {
    while (times.length > KEEP) {
      times.shift();
      for (const name in series) series[name].shift();
    }
    for (const name in series) {   // a series that stopped (a queue or process gone) keeps its place
      while (series[name].length < times.length) series[name].push(null);
    }
  }
  const values = (name) => series[name] || new Array(times.length).fill(null);

  function sample(raw) {
    const now = Date.now() / 1000;
    const dt = previous ? now - previous.time : 0;
    const rate = (cur, prev) => (dt > 0 && prev != null && cur >= prev ? (cur - prev) / dt : null);
    times.push(now);
    const t = raw.totals, pt = previous && previous.totals;
    const inRate = rate(t.messages_published, pt && pt.messages_published);
    const outRate = rate(t.messages_delivered, pt && pt.messages_delivered);
    push("in", inRate);
    push("out", outRate);
    push("clients", raw.session.clients);
    push("subscriptions", raw.session.subscriptions);
    push("stale", raw.stale["stale-queue-size"]);
    push("input", raw.stale["input-queue-size"]);
    push("output", raw.stale["output-queue-size"]);
    const lat = raw.latency, hasLat = lat.count > 0;
    for (const k of ["p50_ms", "p90_ms", "p99_ms", "max_ms"]) push("lat:" + k, hasLat ? lat[k] : null);

    const queueRates = {};
    const prevQueues = {};
    for (const q of (previous ? previous.queues : [])) prevQueues[q.destination] = q;
    for (const q of raw.queues) {
      push("queue:" + q.destination, q.depth);
      const p = prevQueues[q.destination];
      queueRates[q.destination] = { in: rate(q.enqueued, p && p.enqueued), out: rate(q.dequeued, p && p.dequeued) };
    }
    const prevWriters = {};
    for (const w of (previous ? previous.writers : [])) prevWriters[w.index] = w;
    const writerRates = {};
    for (const w of raw.writers) {
      const p = prevWriters[w.index];
      const frames = rate(w.frames, p && p.frames);
      // batch_fill is the mean since start: the fill of this interval comes from the sums
      let fill = null;
      if (p && w.batches > p.batches) fill = (w.batch_fill * w.batches - p.batch_fill * p.batches) / (w.batches - p.batches);
      else if (p) fill = 0;
      writerRates[w.index] = { frames, bytes: rate(w.bytes, p && p.bytes), fill };
      push("writer:" + w.index, frames);
      push("fill:" + w.index, fill == null ? null : Math.max(0, Math.min(1, fill)) * 100);
    }
    const prevProcs = {};
    for (const p of (previous ? previous.process : [])) prevProcs[p.role] = p;
    const procCpu = {};
    for (const p of raw.process) {
      const q = prevProcs[p.role];
      const cpu = q && q.pid === p.pid ? rate(p.cpu_seconds, q.cpu_seconds) : null;
      procCpu[p.role] = cpu == null ? null : cpu * 100;
      push("cpu:" + p.role, procCpu[p.role]);
      push("rss:" + p.role, p.rss);
    }
    const c = raw.cluster || {}, pc = previous && previous.cluster;
    const clusterRates = { in: rate(c.messages_in, pc && pc.messages_in), out: rate(c.messages_out, pc && pc.messages_out) };
    for (const s of (c.streams || [])) {   // messages stored per second, between two reads that differ
      const seen = streamSeen[s.name];
      if (!seen) streamSeen[s.name] = { stored: s.stored, time: now, rate: null };
      else if (s.stored !== seen.stored) {
        seen.rate = s.stored > seen.stored ? (s.stored - seen.stored) / (now - seen.time) : null;
        Object.assign(seen, { stored: s.stored, time: now });
      }
    }
    trim();
    previous = { time: now, totals: t, queues: raw.queues, writers: raw.writers, process: raw.process, cluster: c };
    last = { raw, inRate, outRate, queueRates, writerRates, procCpu, clusterRates };
    render();
  }

  // -- rendering --------------------------------------------------------------------------------
  function setText(id, text) { const el = $(id); if (el.textContent !== text) el.textContent = text; }

  function render() {
    const { raw, inRate, outRate, queueRates, writerRates, procCpu } = last;
    const queued = raw.queues.reduce((a, q) => a + q.depth, 0);
    const unacked = raw.queues.reduce((a, q) => a + q.unacked, 0);
    setText("tile-connections", si(raw.session.clients));
    setText("tile-subscriptions", si(raw.session.subscriptions));
    setText("tile-in-rate", si(inRate));
    setText("tile-out-rate", si(outRate));
    setText("tile-published", si(raw.totals.messages_published, 2));
    setText("tile-delivered", si(raw.totals.messages_delivered, 2));
    setText("tile-queued", si(queued));
    setText("tile-unacked", si(unacked));
    setText("tile-p99", raw.latency.count > 0 ? ms(raw.latency.p99_ms) : "–");
    setText("tile-stale", si(raw.stale["stale-queue-size"]));

    draw({ id: "chart-rates", format: (v) => si(v) + "/s", series: [
      { label: "in (published)", colour: PALETTE[0], values: values("in") },
      { label: "out (delivered)", colour: PALETTE[1], values: values("out") }] });
    draw({ id: "chart-sessions", format: si, series: [
      { label: "connections", colour: PALETTE[0], values: values("clients") },
      { label: "subscriptions", colour: PALETTE[2], values: values("subscriptions") }] });
    const queueNames = Object.keys(series).filter((n) => n.startsWith("queue:")).slice(0, MAX_QUEUE_SERIES);
    draw({ id: "chart-queues", format: si, series: queueNames.map((n, i) => (
      { label: n.slice(6), colour: PALETTE[i % PALETTE.length], values: values(n) })) });
    draw({ id: "chart-latency", format: ms, floor: 0.1, series: [
      { label: "p50", colour: PALETTE[2], values: values("lat:p50_ms") },
      { label: "p90", colour: PALETTE[0], values: values("lat:p90_ms") },
      { label: "p99", colour: PALETTE[1], values: values("lat:p99_ms") },
      { label: "max", colour: PALETTE[3], values: values("lat:max_ms") }] });
    const writerIds = Object.keys(series).filter((n) => n.startsWith("writer:")).map((n) => n.slice(7));
    draw({ id: "chart-writers", format: (v) => si(v) + "/s", series: writerIds.map((i) => (
      { label: "writer-" + i, colour: roleColour("writer-" + i), values: values("writer:" + i) })) });
    draw({ id: "chart-fill", format: pct, floor: 10, series: writerIds.map((i) => (
      { label: "writer-" + i, colour: roleColour("writer-" + i), values: values("fill:" + i) })) });
    const roles = Object.keys(series).filter((n) => n.startsWith("rss:")).map((n) => n.slice(4));
    draw({ id: "chart-cpu", format: pct, floor: 5, series: roles.map((r) => (
      { label: r, colour: roleColour(r), values: values("cpu:" + r) })) });
    draw({ id: "chart-memory", format: bytes, floor: 1 << 20, incrs: BINARY_INCRS, series: roles.map((r) => (
      { label: r, colour: roleColour(r), values: values("rss:" + r) })) });
    draw({ id: "chart-stale", format: si, series: [
      { label: "stale queue (messages)", colour: PALETTE[4], values: values("stale") },
      { label: "input queue (records)", colour: PALETTE[0], values: values("input") },
      { label: "output queues (records)", colour: PALETTE[1], values: values("output") }] });

    setText("queues-shown", raw.queuesTotal ? `(the first ${raw.queues.length} of ${raw.queuesTotal})` : "");
    fillTable("queues", raw.queues.slice().sort((a, b) => b.depth - a.depth || a.destination.localeCompare(b.destination))
      .map((q) => [q.destination, si(q.depth), si(queueRates[q.destination].in), si(queueRates[q.destination].out),
                   si(q.consumers), si(q.unacked), si(q.enqueued), si(q.dequeued)]));
    fillTable("writers", raw.writers.map((w) => [
      swatch("writer-" + w.index), si(w.connections), si(writerRates[w.index].frames),
      writerRates[w.index].bytes == null ? "–" : bytes(writerRates[w.index].bytes) + "/s",
      writerRates[w.index].fill == null ? "–" : pct(writerRates[w.index].fill * 100), bytes(w.pending_bytes)]));
    fillTable("processes", raw.process.map((p) => [swatch(p.role), String(p.pid), pct(procCpu[p.role]), bytes(p.rss)]));
    // cluster mode only: this node, its NATS server and the traffic across nodes
    const c = raw.cluster || {};
    $("cluster-box").hidden = !c.node;
    if (c.node) {
      const { clusterRates } = last;
      fillTable("cluster", [[c.node, c.connected ? c.server : "unreachable", si(c.peers), ms(c.rtt_ms),
                             si(clusterRates.in), si(clusterRates.out), si(c.remote_patterns), si(c.reconnects),
                             // busy nodes (docs/cluster.md): this node, and the others heard saying so
                             (c.busy ? "this node" : "no") + (c.busy_nodes ? ` (+${c.busy_nodes} other)` : "")]]);
      const streams = c.streams || [];
      fillTable("streams", streams.map((s) => [s.name, s.shard || "–", s.leader || "–", si(s.messages),
                                               si((streamSeen[s.name] || {}).rate), bytes(s.bytes)]));
      // how many shards each NATS server leads: one server leading most means one server doing most
      const led = {};
      for (const s of streams) if (s.shard && s.leader) led[s.leader] = (led[s.leader] || 0) + 1;
      $("leaders").textContent = Object.keys(led).length
        ? "Shards led per NATS server: " + Object.keys(led).sort().map((k) => `${k} ${led[k]}`).join(" · ") : "";
    }
  }

  window.stompbrokerFillTable = fillTable;

  function swatch(role) {
    const span = document.createElement("span");
    span.className = "swatch";
    span.style.background = roleColour(role);
    const wrap = document.createElement("span");
    wrap.append(span, document.createTextNode(role));
    return wrap;
  }

  // A table's rows from arrays of cells (text, or a Node; nodeClass names the td of a Node); "none"
  // when there are none. manage.js uses it too.
  function fillTable(id, rows, nodeClass) {
    const body = $(id).tBodies[0];
    body.replaceChildren(...rows.map((cells) => {
      const tr = document.createElement("tr");
      for (const cell of cells) {
        const td = document.createElement("td");
        if (cell instanceof Node) {
          if (nodeClass) td.className = nodeClass;
          td.append(cell);
        } else td.textContent = cell;
        tr.append(td);
      }
      return tr;
    }));
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = document.createElement("td");
      td.colSpan = $(id).tHead.rows[0].cells.length;
      td.className = "empty";
      td.textContent = "none";
      tr.append(td);
      body.append(tr);
    }
  }

  // -- scheduled messages of the virtual host managed (manage.js's choice): GET /api/scheduled every
  // 2 s; a button cancels one, another every one of its destination: management actions (DELETE
  // /api/scheduled/VHOST/DEST[/ID], docs/admin.md), which need logins checked --------------------
  const managed = () => ($("vhost") && $("vhost").value) || "/";
  function cancelButton(text, title, url) {
    const b = document.createElement("button");
    b.textContent = text;
    b.title = title;
    b.className = "cancel";
    b.addEventListener("click", () => {
      b.disabled = true;
      fetch(url, { method: "DELETE", credentials: "same-origin" }).then(async (r) => {
        const status = $("manage-status");  // (manage.js's note: it stays until the next action)
        if (!r.ok && status) {
          const value = await r.json().catch(() => null);
          status.textContent = `cancel refused: ${r.status}: ${(value && value.reason) || r.statusText}`;
          status.className = "note error";
        }
      }).catch(() => {}).finally(scheduled);
    });
    return b;
  }
  function scheduled() {
    const vhost = managed();
    fetch("/api/scheduled?page_size=100&vhost=" + encodeURIComponent(vhost), { credentials: "same-origin", cache: "no-store" })
      .then((r) => r.ok ? r.json() : null).then((page) => {
        if (!page) return;
        setText("scheduled-shown", page.total_count > page.items.length ?
          `(the first ${page.items.length} of ${page.total_count})` : "");
        fillTable("scheduled", page.items.map((j) => {
          const actions = document.createElement("span");
          const path = "/api/scheduled/" + encodeURIComponent(j.vhost) + "/" + encodeURIComponent(j.destination);
          actions.append(cancelButton("cancel", "cancel this one", path + "/" + encodeURIComponent(j.id)),
            cancelButton("cancel all", "cancel every one of " + j.destination, path));
          return [new Date(j.next).toLocaleString(), j.destination, String(j.left), String(j.repeat), j.cron, j.id,
            actions];
        }));
      }).catch(() => {});
  }
  scheduled();
  setInterval(scheduled, 2000);

  // -- STOMP ------------------------------------------------------------------------------------
  function status(text, cls) {
    const el = $("status");
    el.textContent = text;
    el.className = "status " + cls;
  }

  let pending = {};
  let timer = null;
  let renewal = null;     // timer: open a new session before the broker ends this one
  let lifetime = 0;       // seconds a session opened with the current passcode lasts
  let renewing = false;   // the socket closes on purpose: not "reconnecting"
  const client = new StompJs.Client({
    brokerURL: (location.protocol === "https:" ? "wss://" : "ws://") + location.host + (meta("stomp-path") || "/"),
    reconnectDelay: 2000,
    heartbeatIncoming: 10000,
    heartbeatOutgoing: 10000,
  });
  // With logins checked, each STOMP login uses a fresh passcode the page asks for over HTTP (the
  // browser sends the Basic credentials it holds): single-use, for this user at this address, and
  // read-only. The session it opens ends after `expires_in` seconds, so the page opens a new one
  // before then.
  client.beforeConnect = async () => {
    if (meta("stomp-auth") !== "token") return;
    try {
      const answer = await fetch("/console/token", { method: "POST", credentials: "same-origin", cache: "no-store" });
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const token = await answer.json();
      client.connectHeaders = { login: token.login, passcode: token.passcode };
      lifetime = token.expires_in;
    } catch (e) {  // the login goes without one, is refused, and is tried again after reconnectDelay
      client.connectHeaders = {};
      status("no passcode: " + e.message, "down");
    }
  };
  function renew() {
    renewing = true;
    client.deactivate().then(() => client.activate());
  }
  // stompica's DIAG frame: "DIAG" with the query as body, answered by a DIAG frame whose header
  // <query> holds the figures as JSON. Unlike a SEND to a DIAG destination it publishes nothing,
  // so watching does not add to the message counters being watched.
  client.onUnhandledFrame = (frame) => {
    if (frame.command !== "DIAG") return;
    const query = QUERIES.find((q) => q in frame.headers);
    if (!query) return;
    try {  // stompjs unescapes header values; the broker's JSON never holds a raw CR or LF
      pending[query] = JSON.parse(frame.headers[query].replace(/\n/g, "\\n").replace(/\r/g, "\\r"));
    } catch (e) {
      return;
    }
    // a long list comes cut to the broker's max_answer_bytes: the page shows the first part and says so
    if (query === "queues") pending.queuesTotal = frame.headers.truncated === "true" ? Number(frame.headers.total) : null;
    if (query === QUERIES[QUERIES.length - 1] && QUERIES.every((q) => q in pending)) {
      const raw = pending;
      pending = {};
      sample(raw);
    }
  };
  client.onConnect = () => {
    status("live", "live");
    renewing = false;
    clearTimeout(renewal);
    if (lifetime) renewal = setTimeout(renew, lifetime * 800);  // at four fifths of the session's life
    pending = {};
    const ask = () => {
      const socket = client.webSocket;
      if (socket && socket.readyState === WebSocket.OPEN) {
        for (const q of QUERIES) socket.send("DIAG\n\n" + q + "\0");
      }
    };
    ask();
    clearInterval(timer);
    timer = setInterval(ask, 1000);
    fetch("/api/overview", { credentials: "same-origin" }).then((r) => r.ok ? r.json() : null).then((o) => {
      if (!o) return;
      const started = o.broker.start / 1000;
      setText("broker-info", `version ${o.broker.version} · pid ${o.broker.pid} · started ${new Date(started * 1000).toLocaleString()}`);
      window.__brokerStart = started;
    }).catch(() => {});
  };
  client.onStompError = (frame) => status("refused: " + (frame.headers.message || "error"), "down");
  client.onWebSocketClose = () => {
    clearInterval(timer);
    clearTimeout(renewal);
    pending = {};
    if (!renewing && !$("status").classList.contains("down")) status("reconnecting…", "connecting");
  };
  client.activate();

  setInterval(() => {
    const up = window.__brokerStart ? " · up " + duration(Date.now() / 1000 - window.__brokerStart) : "";
    setText("clock", new Date().toLocaleTimeString() + up);
  }, 1000);
})();
