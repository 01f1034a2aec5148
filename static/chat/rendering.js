/*
 * How a message looks: answers rendered as Markdown by the vendored markdown-it, and one view
 * per assistant bubble (its text, status line, "simulated engine" label, error, sources and
 * thumbs).
 * The stream decides what to show; this module only shows it.
 */
import markdownit from "../vendor/markdown-it.esm.min.js";

// Only these may become links; anything else (javascript:, data:, relative paths) stays text.
const LINK_SCHEMES = /^(?:https?:|mailto:)/i;

// html: false escapes every tag a model (or a prompt injected into it) writes, so an answer
// containing HTML shows as text. breaks: a model's single newlines are meant as line breaks.
const markdown = markdownit({ html: false, linkify: true, breaks: true });
// Bare links only when they say http(s)://, never a guess from "example.com".
markdown.linkify.set({ fuzzyLink: false });
// An answer never loads a picture from elsewhere (tracking, mixed content): images stay text.
markdown.disable("image");
markdown.validateLink = (url) => LINK_SCHEMES.test(url.trim());

// Headings inside a bubble sit below the page's own h1 and h2.
markdown.core.ruler.push("nested_headings", (state) => {
  for (const token of state.tokens) {
    if (token.type === "heading_open" || token.type === "heading_close") {
      token.tag = `h${Math.min(Number(token.tag.slice(1)) + 2, 6)}`;
    }
  }
});

markdown.renderer.rules.link_open = (tokens, index, options, env, renderer) => {
  tokens[index].attrSet("target", "_blank");
  tokens[index].attrSet("rel", "noopener noreferrer");
  return renderer.renderToken(tokens, index, options);
};

/** Markdown source → safe HTML: escaped text, our tags only, links only to http(s)/mailto. */
export function renderMarkdown(source) {
  return markdown.render(String(source));
}

function scroller() {
  return document.getElementById("chat-scroll") || document.getElementById("messages");
}

/** Runs a DOM change and keeps the view pinned to the newest text if it was there before. */
function keepingScroll(change) {
  const box = scroller();
  const pinned = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  change();
  if (pinned) box.scrollTop = box.scrollHeight;
}

export function scrollToBottom() {
  const box = scroller();
  box.scrollTop = box.scrollHeight;
}

/** One assistant bubble as the reader sees it. */
export class AnswerView {
  constructor(bubble) {
    this.bubble = bubble;
    this.content = bubble.querySelector(".bubble__content");
    this.statusLine = bubble.querySelector(".bubble__status");
    this.error = bubble.querySelector(".bubble__error");
    this.renderScheduled = false;
    this.pendingText = "";
  }

  /** The text the server stored with the page (escaped by the template, read back as text). */
  storedText() {
    return this.content.textContent;
  }

  render(text) {
    this.renderScheduled = false;
    keepingScroll(() => {
      this.content.innerHTML = renderMarkdown(text);
      this.content.classList.add("markdown--rendered");
    });
  }

  /** Streaming re-renders at most once per frame, however fast tokens arrive. */
  scheduleRender(text) {
    this.pendingText = text;
    if (this.renderScheduled) return;
    this.renderScheduled = true;
    requestAnimationFrame(() => {
      if (this.renderScheduled) this.render(this.pendingText);
    });
  }

  status(text) {
    this.statusLine.textContent = text;
  }

  /** What the answer is doing (queued, streaming, reset), for styling and for tests. */
  phase(name) {
    if (name) this.bubble.dataset.phase = name;
    else delete this.bubble.dataset.phase;
  }

  streaming(on) {
    this.bubble.classList.toggle("bubble--streaming", on);
  }

  markSimulated() {
    this.bubble.querySelector(".bubble__simulated").hidden = false;
  }

  showError(message, code) {
    if (code) this.bubble.dataset.errorCode = code;
    this.error.textContent = message;
    this.error.hidden = false;
  }

  /** The answer reached its end: no more Stop; the thumbs and the help articles it was
   * written from once it is a finished answer. */
  finish(status, finalText) {
    this.render(finalText);
    this.streaming(false);
    this.phase("");
    this.bubble.dataset.status = status;
    this.bubble.removeAttribute("aria-busy");
    const stopButton = this.bubble.querySelector(".stop-button");
    if (stopButton) stopButton.remove();
    const feedback = this.bubble.querySelector(".feedback");
    if (feedback && status === "done") feedback.hidden = false;
    const sources = this.bubble.querySelector(".bubble__sources");
    if (sources && status === "done") sources.hidden = false;
  }
}
