/*
 * The agents' inbox: renders the lists (waiting, mine, resolved today) and the open
 * conversation from data, never from HTML sent by the server. The inbox socket pushes the
 * lists whenever they change and the open conversation's events; the tab beats on it, which
 * is the agent's presence. While the socket is down the lists are read every few seconds.
 * A reply or note stays in the box until the server has stored it.
 */

const page = {};
let snapshot = null;
let openId = null;
let transcript = null;
let socket = null;
let socketUp = false;
let reconnects = 0;
let beatTimer = null;
let pollTimer = null;
let typingTimer = null;
let lastTypingSent = 0;

const RECONNECT_DELAYS_MS = [500, 1000, 2000, 5000, 10000];
const POLL_MS = 5000;
const TYPING_SEND_EVERY_MS = 3000;
const TYPING_SHOWN_MS = 5000;

function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.content : "";
}

function el(tag, className, text) {
  const element = document.createElement(tag);
  if (className) element.className = className;
  if (text !== undefined && text !== null) element.textContent = text;
  return element;
}

function formatWait(seconds) {
  if (seconds < 60) return `${Math.max(0, Math.floor(seconds))} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
}

function formatTime(iso) {
  return new Date(iso).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

/** How a wait compares with the first-response target: ok, near (past half), late. */
function waitLevel(seconds, target) {
  if (seconds >= target) return "late";
  if (seconds >= target / 2) return "near";
  return "ok";
}

function showError(message) {
  page.error.textContent = message;
  page.error.hidden = !message;
}

// --- the lists ----------------------------------------------------------------------------------

function listItem(row, extra) {
  const item = el("li", "inbox-item");
  item.dataset.conversation = row.id;
  if (row.id === openId) item.setAttribute("aria-current", "true");
  const button = el("button", "inbox-item__open");
  button.type = "button";
  const head = el("span", "inbox-item__head");
  head.append(el("strong", "inbox-item__customer", row.customer));
  if (row.vip) head.append(el("span", "badge badge--vip", "VIP"));
  button.append(head, el("span", "inbox-item__title", row.title || row.last_message || "(no message yet)"));
  extra(item, button, row);
  button.addEventListener("click", () => openConversation(row.id));
  item.append(button);
  return item;
}

function renderList(list, count, rows, extra) {
  list.replaceChildren(...rows.map((row) => listItem(row, extra)));
  count.textContent = String(rows.length);
  if (!rows.length) list.append(el("li", "inbox-list__empty", "None."));
}

function renderWaitTimes() {
  if (!snapshot) return;
  const now = Date.now();
  page.waiting.querySelectorAll("[data-since]").forEach((badge) => {
    const waited = (now - Date.parse(badge.dataset.since)) / 1000;
    badge.textContent = `waiting ${formatWait(waited)}`;
    badge.dataset.level = waitLevel(waited, snapshot.target_s);
  });
}

function renderSnapshot(data) {
  snapshot = data;
  renderList(page.waiting, page.waitingCount, data.waiting, (item, button, row) => {
    const since = el("span", "inbox-item__wait");
    since.dataset.since = row.requested_at;
    button.append(since);
    if (row.offered_to_me) {
      item.classList.add("inbox-item--offered");
      button.append(el("span", "inbox-item__offer", "Offered to you"));
    } else if (row.offered_to) {
      button.append(el("span", "inbox-item__note", `Offered to ${row.offered_to}`));
    }
    if (row.left_question) button.append(el("span", "inbox-item__note", "Left a question while nobody was online"));
  });
  renderList(page.mine, page.mineCount, data.mine, (item, button, row) => {
    if (row.awaiting_reply) {
      item.classList.add("inbox-item--awaiting");
      button.append(el("span", "inbox-item__offer", "Awaiting your reply"));
    }
  });
  renderList(page.resolved, page.resolvedCount, data.resolved_today, (item, button, row) => {
    const rated = row.rating ? ` · rated ${row.rating}/5` : "";
    button.append(el("span", "inbox-item__note", `resolved ${formatTime(row.resolved_at)}${rated}`));
  });
  renderWaitTimes();
  const me = data.me;
  const others = data.agents_online.map((a) => `${a.name} (${a.load}/${a.capacity})`).join(", ");
  page.presence.textContent =
    `${me.online ? "You are online" : "You are away"} as ${me.display_name}, answering ${me.load} of ` +
    `${me.capacity}. Online: ${others || "nobody"}.`;
  page.presence.dataset.online = String(me.online);
}

// --- the open conversation ---------------------------------------------------------------------------

function messageItem(message) {
  const item = el("li", `transcript__item transcript__item--${message.role}`);
  item.dataset.messageId = String(message.id);
  const who = {
    user: "Customer",
    assistant: "Assistant",
    agent: message.author || "Agent",
    note: `Private note · ${message.author || "agent"}`,
  }[message.role];
  const meta = el("div", "transcript__meta");
  meta.append(el("strong", null, who), el("time", null, formatTime(message.at)));
  if (message.role === "assistant") {
    if (message.variant) meta.append(el("span", "transcript__tag", message.variant));
    if (message.engine === "help-center") meta.append(el("span", "transcript__tag", "declined: nothing in the help center"));
    if (message.feedback === -1) meta.append(el("span", "transcript__tag transcript__tag--down", "thumbs down"));
    if (message.feedback === 1) meta.append(el("span", "transcript__tag", "thumbs up"));
    if (message.status && message.status !== "done") meta.append(el("span", "transcript__tag", message.status));
  }
  item.append(meta, el("p", "transcript__text", message.text));
  if (message.sources && message.sources.length) {
    const sources = el("ul", "transcript__sources");
    message.sources.forEach((source) => {
      const link = el("a", null, source.title);
      link.href = `/help/${encodeURIComponent(source.slug)}`;
      link.target = "_blank";
      link.rel = "noopener";
      const entry = el("li");
      entry.append(link);
      sources.append(entry);
    });
    item.append(sources);
  }
  return item;
}

function renderTranscript() {
  const data = transcript;
  const entries = [
    ...data.messages,
    ...data.notes.map((note) => ({ ...note, id: `note-${note.id}`, role: "note" })),
  ].sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
  page.transcript.replaceChildren(...entries.map(messageItem));
  page.heading.textContent = `${data.customer}${data.vip ? " (VIP)" : ""}`;
  const states = {
    waiting: "Waiting for a person.",
    agent: data.assigned_to_me ? "You are answering." : `${data.assignee} is answering.`,
    resolved: "Resolved.",
    assistant: "With the assistant.",
  };
  const handoffs = data.handoffs.map((h) => `${h.trigger} at ${formatTime(h.requested_at)}`).join("; ");
  page.state.textContent = `${states[data.state]}${handoffs ? ` Asked for a person: ${handoffs}.` : ""}`;
  page.claim.hidden = data.state !== "waiting";
  page.handBack.hidden = page.resolve.hidden = !(data.state === "agent" && data.assigned_to_me);
  page.replyButton.disabled = !(data.state === "agent" && data.assigned_to_me);
  page.earlier.hidden = !data.earlier.length;
  page.earlierList.replaceChildren(
    ...data.earlier.map((previous) => {
      const details = el("details", "inbox__earlier-item");
      details.append(el("summary", null, `${formatTime(previous.started_at)} · ${previous.title || "(no question)"}`));
      const list = el("ol", "transcript");
      list.append(...previous.messages.map(messageItem));
      details.append(list);
      return details;
    }),
  );
  page.transcript.scrollTop = page.transcript.scrollHeight;
}

async function loadTranscript(conversationId) {
  const response = await fetch(`${page.root.dataset.conversationUrl}${conversationId}`, {
    headers: { Accept: "application/json" },
    credentials: "same-origin",
  });
  if (!response.ok) {
    showError(response.status === 404 ? "This conversation does not exist." : `Could not load it (HTTP ${response.status}).`);
    return;
  }
  transcript = await response.json();
  if (conversationId !== openId) return;
  renderTranscript();
  watch();
}

function watch() {
  if (socketUp && transcript) {
    socket.send(JSON.stringify({ type: "watch", conversation: transcript.id, after: transcript.events_after }));
  }
}

function openConversation(conversationId) {
  openId = conversationId;
  transcript = null;
  showError("");
  page.conversation.hidden = false;
  page.customerTyping.hidden = true;
  const url = new URL(window.location.href);
  url.searchParams.set("c", conversationId);
  window.history.replaceState(null, "", url);
  page.lists.querySelectorAll(".inbox-item").forEach((item) => {
    item.toggleAttribute("aria-current", item.dataset.conversation === conversationId);
  });
  loadTranscript(conversationId);
}

function onConversationEvent(message) {
  if (!transcript || message.conversation !== transcript.id) return;
  transcript.events_after = message.id;
  if (message.event === "message") {
    if (!transcript.messages.some((m) => m.id === message.data.id)) {
      transcript.messages.push(message.data);
      page.transcript.append(messageItem(message.data));
      page.transcript.scrollTop = page.transcript.scrollHeight;
    }
    if (message.data.role === "user") page.customerTyping.hidden = true;
  } else if (message.event === "typing") {
    const fresh = Date.now() - message.at_ms < TYPING_SHOWN_MS;
    if (message.data.who === "customer" && fresh) {
      page.customerTyping.hidden = false;
      clearTimeout(typingTimer);
      typingTimer = setTimeout(() => {
        page.customerTyping.hidden = true;
      }, TYPING_SHOWN_MS);
    }
  } else {
    loadTranscript(transcript.id); // who has it changed: read it again
  }
}

// --- actions ------------------------------------------------------------------------------------

async function act(path, body) {
  let response;
  try {
    response = await fetch(`${page.root.dataset.conversationUrl}${openId}/${path}`, {
      method: "POST",
      headers: { "X-CSRFToken": csrfToken(), Accept: "application/json" },
      credentials: "same-origin",
      body,
    });
  } catch {
    showError("Could not reach the server: nothing was sent. Try again.");
    return null;
  }
  const payload = await response.json().catch(() => ({}));
  if (!response.ok) {
    showError((payload.error && payload.error.message) || `Something went wrong (HTTP ${response.status}).`);
    return null;
  }
  showError("");
  return payload;
}

async function onAction(path) {
  const id = openId;
  const done = await act(path);
  if (id === openId) loadTranscript(id);
  return done;
}

async function onSubmit(event) {
  event.preventDefault();
  const kind = event.submitter && event.submitter.value === "note" ? "note" : "reply";
  const text = page.input.value;
  const body = new FormData();
  body.set("text", text);
  const saved = await act(kind, body);
  if (!saved) return; // the text stays in the box
  if (page.input.value === text) page.input.value = "";
  if (kind === "note") {
    transcript.notes.push(saved);
    page.transcript.append(messageItem({ ...saved, id: `note-${saved.id}`, role: "note" }));
  } else if (!transcript.messages.some((m) => m.id === saved.id)) {
    const message = { ...saved, at: new Date().toISOString() };
    transcript.messages.push(message);
    page.transcript.append(messageItem(message));
  }
  page.transcript.scrollTop = page.transcript.scrollHeight;
}

function onInput() {
  if (!socketUp || !transcript || !transcript.assigned_to_me || transcript.state !== "agent") return;
  const now = Date.now();
  if (now - lastTypingSent < TYPING_SEND_EVERY_MS) return;
  lastTypingSent = now;
  socket.send(JSON.stringify({ type: "typing", conversation: transcript.id }));
}

// --- the socket ---------------------------------------------------------------------------------

async function poll() {
  try {
    const response = await fetch(page.root.dataset.snapshotUrl, {
      headers: { Accept: "application/json" },
      credentials: "same-origin",
    });
    if (response.ok) renderSnapshot(await response.json());
  } catch {
    // the next poll tries again
  }
}

function connect() {
  const scheme = window.location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${scheme}://${window.location.host}${page.root.dataset.socketPath}`);
  socket.addEventListener("open", () => {
    socketUp = true;
    reconnects = 0;
    clearInterval(pollTimer);
    pollTimer = null;
    beatTimer = setInterval(() => socket.send(JSON.stringify({ type: "beat" })), Number(page.root.dataset.beatS) * 1000);
    watch();
  });
  socket.addEventListener("message", (event) => {
    const message = JSON.parse(event.data);
    if (message.type === "inbox") renderSnapshot(message);
    else if (message.type === "event") onConversationEvent(message);
  });
  socket.addEventListener("close", () => {
    socketUp = false;
    clearInterval(beatTimer);
    page.presence.textContent = "Reconnecting… (you show as away meanwhile)";
    if (!pollTimer) pollTimer = setInterval(poll, POLL_MS);
    const delay = RECONNECT_DELAYS_MS[Math.min(reconnects, RECONNECT_DELAYS_MS.length - 1)];
    reconnects += 1;
    setTimeout(connect, delay);
  });
}

function init() {
  page.root = document.getElementById("inbox");
  if (!page.root) return;
  const get = (id) => document.getElementById(id);
  Object.assign(page, {
    lists: page.root.querySelector(".inbox__lists"),
    waiting: get("inbox-waiting"),
    waitingCount: get("waiting-count"),
    mine: get("inbox-mine"),
    mineCount: get("mine-count"),
    resolved: get("inbox-resolved"),
    resolvedCount: get("resolved-count"),
    presence: get("inbox-presence"),
    conversation: get("inbox-conversation"),
    heading: get("conversation-heading"),
    state: get("conversation-state"),
    transcript: get("transcript"),
    customerTyping: get("customer-typing"),
    error: get("inbox-error"),
    claim: get("claim-button"),
    handBack: get("hand-back-button"),
    resolve: get("resolve-button"),
    replyButton: get("reply-button"),
    input: get("reply-input"),
    earlier: get("earlier"),
    earlierList: get("earlier-list"),
  });
  page.claim.addEventListener("click", () => onAction("claim"));
  page.handBack.addEventListener("click", () => onAction("hand-back"));
  page.resolve.addEventListener("click", () => onAction("resolve"));
  get("reply-form").addEventListener("submit", onSubmit);
  page.input.addEventListener("input", onInput);
  renderSnapshot(JSON.parse(get("inbox-data").textContent));
  setInterval(renderWaitTimes, 1000);
  const requested = new URL(window.location.href).searchParams.get("c");
  if (requested) openConversation(requested);
  connect();
}

init();
