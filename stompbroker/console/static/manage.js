// stompbroker web console, management part (docs/admin.md): queues with purge, delete, move and a
// message browser, the dead-letter queue with "redrive all", connections with close. Every action
// is a JSON request to /api on this page's origin; the browser adds the Basic credentials it holds.
// Destructive actions ask first, in a dialog.
"use strict";

(function () {
  const PAGE = 20;                       // queues and messages per page
  const $ = (id) => document.getElementById(id);
  const meta = (name) => (document.querySelector(`meta[name="${name}"]`) || {}).content || "";
  const enc = encodeURIComponent;
  const DLQ = meta("dead-letter-queue") || "/queue/DLQ";
  let vhost = "/";                       // the virtual host managed (a choice when there are several)

  let queuePage = 1;
  let queuePages = 1;
  let browsing = null;                   // the queue the browser shows
  let offset = 0;

  function note(text, error) {
    const el = $("manage-status");
    el.textContent = text;
    el.className = "note" + (error ? " error" : "");
  }

  async function api(method, path, body) {
    const init = { method, credentials: "same-origin", cache: "no-store", headers: {} };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const answer = await fetch(path, init);
    let value = null;
    try { value = await answer.json(); } catch (e) { /* a plain-text refusal */ }
    if (!answer.ok) throw new Error(`${answer.status}: ${(value && value.reason) || answer.statusText}`);
    return value;
  }

  // The page's own confirmation: a modal dialog (with a text field when the action needs a value).
  function confirmAction(text, okLabel, input) {
    const dialog = $("confirm");
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = okLabel;
    const field = $("confirm-input");
    field.hidden = input === undefined;
    field.value = input || "";
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok" ? field.value : null), { once: true });
      dialog.returnValue = "";
      dialog.showModal();
      if (!field.hidden) field.focus();
    });
  }

  async function act(label, method, path, body) {
    try {
      const value = await api(method, path, body);
      note(label + ": " + JSON.stringify(value));
      await refresh();
      return value;
    } catch (e) {
      note(label + " refused: " + e.message, true);
      return null;
    }
  }

  function button(text, onclick, danger) {
    const b = document.createElement("button");
    b.textContent = text;
    b.className = danger ? "danger" : "";
    b.addEventListener("click", onclick);
    return b;
  }

  function rows(id, items, cells) {
    window.stompbrokerFillTable(id, items.map(cells), "actions");  // (console.js's, loaded first)
  }

  const queuePath = (dest, tail) => `/api/queues/${enc(vhost)}/${enc(dest)}${tail || ""}`;
  const inVhost = () => "&vhost=" + enc(vhost);

  function queueActions(q) {
    const span = document.createElement("span");
    span.append(
      button("Browse", () => browse(q.destination, 0)),
      button("Move…", async () => {
        const to = await confirmAction(`Move the ${q.depth} waiting messages of ${q.destination} to:`, "Move", "/queue/");
        if (to) await act("move", "POST", queuePath(q.destination, "/move"), { to });
      }, true),
      button("Purge", async () => {
        if (await confirmAction(`Purge the ${q.depth} waiting messages of ${q.destination}?`, "Purge") !== null)
          await act("purge", "DELETE", queuePath(q.destination, "/messages"));
      }, true),
      button("Delete", async () => {
        if (await confirmAction(`Delete ${q.destination} and its ${q.depth} waiting messages?`, "Delete") !== null)
          await act("delete", "DELETE", queuePath(q.destination));
      }, true));
    span.dataset.destination = q.destination;
    return span;
  }

  async function loadQueues() {
    const name = $("queue-filter").value;
    const list = await api("GET", `/api/queues?sort=name&page=${queuePage}&page_size=${PAGE}` + inVhost() +
                                  (name ? "&name=" + enc(name) : ""));
    queuePages = Math.max(1, list.page_count);
    $("queues-page").textContent = ` page ${list.page} of ${queuePages} (${list.filtered_count} queues) `;
    rows("manage-queues", list.items, (q) => [q.destination, String(q.depth), String(q.consumers),
                                              String(q.unacked), queueActions(q)]);
    const dlq = await api("GET", "/api/queues?name=" + enc(DLQ) + inVhost());
    const entry = dlq.items.find((q) => q.destination === DLQ);
    $("dlq-depth").textContent = `${entry ? entry.depth : 0} waiting`;
  }

  async function loadConnections() {
    const list = await api("GET", `/api/connections?page_size=${PAGE}`);
    const stomp = list.items.filter((c) => c.connected && (c.vhost || "/") === vhost);
    rows("manage-connections", stomp, (c) => [String(c.id), c.peer, c.login || "–", String(c.subscription_count),
      button("Close", async () => {
        const reason = await confirmAction(`Close connection ${c.id} (${c.login || "anonymous"} from ${c.peer})? ` +
                                           "The client gets an ERROR with this reason:", "Close", "closed by an operator");
        if (reason !== null) await act("close", "DELETE", `/api/connections/${c.id}`, { reason });
      }, true)]);
  }

  async function browse(dest, from) {
    browsing = dest;
    offset = Math.max(0, from);
    let answer;
    try {
      answer = await api("GET", queuePath(dest, `/messages?count=${PAGE}&offset=${offset}&truncate=200`));
    } catch (e) {
      note("browse refused: " + e.message, true);
      return;
    }
    $("browser-queue").textContent = `in ${dest}`;
    const last = offset + answer.count;
    $("browser-range").textContent = answer.depth ? ` ${offset + 1}–${last} of ${answer.depth} ` : " empty ";
    $("browser-prev").disabled = offset === 0;
    $("browser-next").disabled = last >= answer.depth;
    let n = offset;
    rows("browser", answer.messages, (m) => {
      const shown = {};
      for (const k in m.headers) if (k !== "destination" && k !== "content-length") shown[k] = m.headers[k];
      const body = (m.payload_encoding === "base64" ? "base64: " : "") + m.payload + (m.truncated ? "…" : "");
      return [String(++n), m.message_id, JSON.stringify(shown), String(m.size), body];
    });
    for (const td of $("browser").querySelectorAll("tbody td:last-child")) td.classList.add("body");
  }

  async function refresh() {
    try {
      await loadQueues();
      await loadConnections();
      if (browsing) await browse(browsing, offset);
    } catch (e) {
      note("cannot manage: " + e.message, true);
    }
  }

  async function loadVhosts() {
    const list = await api("GET", "/api/vhosts");
    const select = $("vhost");
    select.replaceChildren(...list.items.map((v) => new Option(v.name, v.name, false, v.name === vhost)));
    select.hidden = list.items.length < 2;  // one vhost: nothing to choose
  }

  $("dlq-name").textContent = DLQ;
  $("vhost").addEventListener("change", () => {
    vhost = $("vhost").value;
    queuePage = 1;
    browsing = null;
    rows("browser", [], () => []);
    $("browser-queue").textContent = "";
    $("browser-range").textContent = "";
    refresh();
  });
  $("queues-refresh").addEventListener("click", refresh);
  $("queue-filter").addEventListener("change", () => { queuePage = 1; refresh(); });
  $("queues-prev").addEventListener("click", () => { if (queuePage > 1) { queuePage--; refresh(); } });
  $("queues-next").addEventListener("click", () => { if (queuePage < queuePages) { queuePage++; refresh(); } });
  $("browser-prev").addEventListener("click", () => browse(browsing, offset - PAGE));
  $("browser-next").addEventListener("click", () => browse(browsing, offset + PAGE));
  $("dlq-browse").addEventListener("click", () => browse(DLQ, 0));
  $("dlq-redrive").addEventListener("click", async () => {
    if (await confirmAction(`Send every message in ${DLQ} back to its original destination?`, "Redrive all") !== null)
      await act("redrive", "POST", queuePath(DLQ, "/move"), {});
  });
  loadVhosts().catch(() => {}).then(refresh);
})();
