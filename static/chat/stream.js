/*
 * One answer's stream: an EventSource on the bubble's stream URL that shows the queue status,
 * appends tokens in order, starts over on `reset`, and resumes after a lost connection by
 * replaying from the first event (so every token is shown exactly once).
 */
import { AnswerView } from "./rendering.js";

const RECONNECT_DELAYS_MS = [1000, 2000, 4000, 8000];
const MAX_RESYNCS = 3;

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

function formatWait(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "";
  return `, about ${Math.max(1, Math.round(seconds))} s`;
}

class AnswerStream {
  constructor(bubble, onFinish) {
    this.view = new AnswerView(bubble);
    this.url = bubble.dataset.streamUrl;
    this.onFinish = onFinish;
    this.text = "";
    this.tokensShown = 0; // tokens of the current attempt already appended
    this.statusText = this.view.statusLine.textContent; // shown again after a reconnect
    this.source = null;
    this.finished = false;
    this.reconnects = 0;
    this.resyncs = 0;
  }

  setPhase(text) {
    this.statusText = text;
    this.view.status(text);
  }

  open() {
    const source = new EventSource(this.url);
    this.source = source;
    const on = (type, handler) =>
      source.addEventListener(type, (event) => {
        if (this.source !== source || this.finished) return;
        this.reconnects = 0;
        handler.call(this, parseJson(event.data) || {});
      });
    on("status", this.onStatus);
    on("token", this.onToken);
    on("reset", this.onReset);
    on("done", this.onDone);
    source.addEventListener("open", () => {
      if (this.source === source && !this.finished) this.view.status(this.statusText);
    });
    // A server-sent `event: error` and a lost connection share the name "error".
    source.addEventListener("error", (event) => {
      if (this.source !== source || this.finished) return;
      if (event instanceof MessageEvent) this.onServerError(parseJson(event.data) || {});
      else this.onConnectionLost(source);
    });
  }

  /** Starts the stream over from its first event, forgetting what was shown. */
  restart() {
    if (this.source) this.source.close();
    this.text = "";
    this.tokensShown = 0;
    this.view.render("");
    this.open();
  }

  onStatus(data) {
    if (data.state === "queued") {
      const position = Number.isFinite(data.position) ? ` — position ${data.position}` : "";
      this.setPhase(`Queued${position}${formatWait(data.eta_s)}`);
      this.view.streaming(false);
    } else if (data.state === "starting" || data.state === "running") {
      this.setPhase(this.tokensShown > 0 ? "" : "Thinking…");
      this.view.streaming(data.state === "running");
    }
    this.view.phase(data.state || "");
  }

  onToken(data) {
    if (data.seq === this.tokensShown && typeof data.text === "string") {
      this.text += data.text;
      this.tokensShown += 1;
      if (this.statusText) this.setPhase("");
      this.view.streaming(true);
      this.view.phase("streaming");
      this.view.scheduleRender(this.text);
    } else if (data.seq > this.tokensShown && this.resyncs < MAX_RESYNCS) {
      // A gap means events went missing: replay the whole stream rather than show a hole.
      this.resyncs += 1;
      this.restart();
    }
    // A seq below tokensShown is a duplicate and is ignored.
  }

  onReset() {
    this.text = "";
    this.tokensShown = 0;
    this.view.render("");
    this.setPhase("Restarting the answer…");
    this.view.streaming(false);
    this.view.phase("reset");
  }

  onDone(data) {
    const timings = data.timings || {};
    if (typeof timings.engine === "string" && timings.engine.startsWith("simulated")) {
      this.view.markSimulated();
    }
    const reason = data.finish_reason || "stop";
    this.view.bubble.dataset.finishReason = reason;
    // Others decide what an ended answer offers (handoff.js: a person, under a decline).
    this.view.bubble.dispatchEvent(new CustomEvent("answer-done", { bubbles: true, detail: data }));
    if (reason === "cancelled") {
      this.finish("cancelled", "Stopped");
    } else if (reason === "length" && !data.grounding) {
      // A checked answer (its `grounding`) ends at its last whole sentence: nothing is cut.
      this.finish("done", "Cut off at the length limit.");
    } else {
      this.finish("done", this.text.trim() ? "" : "The assistant returned no text.");
    }
  }

  onServerError(data) {
    this.fail(data.message || "Something went wrong while writing this answer.", data.code);
  }

  /** EventSource retries by itself while CONNECTING; once CLOSED, we start over a few times. */
  onConnectionLost(source) {
    if (source.readyState !== EventSource.CLOSED) {
      this.view.status("Connection lost — reconnecting…");
      return;
    }
    if (this.reconnects >= RECONNECT_DELAYS_MS.length) {
      source.close();
      this.fail("Lost the connection to this answer. Reload the page to see it.");
      return;
    }
    this.view.status("Connection lost — reconnecting…");
    const delay = RECONNECT_DELAYS_MS[this.reconnects];
    this.reconnects += 1;
    this.source = null;
    setTimeout(() => {
      if (!this.finished) this.restart();
    }, delay);
  }

  fail(message, code) {
    this.view.showError(message, code);
    this.finish("error", "");
  }

  /** Close the stream (or EventSource reconnects forever) and leave the bubble in its end state. */
  finish(status, statusText) {
    this.finished = true;
    if (this.source) this.source.close();
    this.source = null;
    this.setPhase(statusText);
    this.view.finish(status, this.text);
    this.onFinish();
  }
}

/**
 * Streams a pending answer into its bubble, from the beginning without Last-Event-ID: the
 * replay rebuilds the text exactly once. `onFinish` runs when the answer has ended.
 */
export function followAnswer(bubble, { onFinish }) {
  new AnswerStream(bubble, onFinish).open();
}
