// The chat: the conversation (kept in this browser's local storage), answers streamed from the
// server's own /v1/chat/completions, reasoning folded, stop (the request is cancelled on the server
// when its stream is dropped), copy and regenerate.

import { api, errorText, NeedKey, serverEvents } from "./api.js";

const STORE = "strata.chat";

export class Chat {
  constructor(model) {
    this.model = model; // () => the model id to name in requests
    this.list = document.getElementById("messages");
    this.prompt = document.getElementById("prompt");
    this.sendButton = document.getElementById("send");
    this.stopButton = document.getElementById("stop");
    this.fields = {
      system: document.getElementById("system"),
      temperature: document.getElementById("temperature"),
      maxTokens: document.getElementById("max-tokens"),
    };
    this.controller = null; // the running answer's, while one streams
    this.state = this.load();
    for (const [name, input] of Object.entries(this.fields)) {
      input.value = this.state[name] ?? "";
      input.addEventListener("change", () => {
        this.state[name] = input.value;
        this.save();
      });
    }
    document.getElementById("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      this.send();
    });
    this.prompt.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.send();
      }
    });
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && this.controller) this.stop();
    });
    this.stopButton.addEventListener("click", () => this.stop());
    document.getElementById("new-chat").addEventListener("click", () => this.clear());
    this.renderAll();
  }

  load() {
    try {
      const saved = JSON.parse(localStorage.getItem(STORE) || "{}");
      return { ...saved, messages: Array.isArray(saved.messages) ? saved.messages : [] };
    } catch {
      return { messages: [] };
    }
  }

  save() {
    localStorage.setItem(STORE, JSON.stringify(this.state));
  }

  clear() {
    if (this.controller) this.stop();
    this.state.messages = [];
    this.save();
    this.renderAll();
    this.prompt.focus();
  }

  get busy() {
    return this.controller !== null;
  }

  send() {
    const text = this.prompt.value.trim();
    if (!text || this.busy) return;
    this.prompt.value = "";
    this.state.messages.push({ role: "user", content: text });
    this.save();
    this.renderAll();
    this.answer();
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  regenerate() {
    const last = this.state.messages.at(-1);
    if (this.busy || !last || last.role !== "assistant") return;
    this.state.messages.pop();
    this.save();
    this.renderAll();
    this.answer();
  }

  // the request's messages: the system prompt, then the conversation (failed answers left out)
  requestMessages() {
    const out = [];
    const system = this.fields.system.value.trim();
    if (system) out.push({ role: "system", content: system });
    for (const m of this.state.messages) {
      if (m.role === "user" || (m.content && !m.error)) out.push({ role: m.role, content: m.content });
    }
    return out;
  }

  requestBody() {
    const body = { model: this.model(), messages: this.requestMessages(), stream: true,
                   stream_options: { include_usage: true } };
    const temperature = parseFloat(this.fields.temperature.value);
    const maxTokens = parseInt(this.fields.maxTokens.value, 10);
    if (Number.isFinite(temperature)) body.temperature = temperature;
    if (Number.isFinite(maxTokens) && maxTokens > 0) body.max_tokens = maxTokens;
    return body;
  }

  async answer() {
    const reply = { role: "assistant", content: "", reasoning: "" };
    this.state.messages.push(reply);
    this.renderAll();
    const view = this.list.lastElementChild;
    this.controller = new AbortController();
    this.setBusy(true);
    const started = performance.now();
    let first = null;
    try {
      const response = await api("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(this.requestBody()), signal: this.controller.signal,
      });
      if (!response.ok) {
        reply.error = await errorText(response);
      } else {
        for await (const { data } of serverEvents(response)) {
          if (data === "[DONE]") break;
          const chunk = JSON.parse(data);
          if (chunk.error) {
            reply.error = chunk.error.message || JSON.stringify(chunk.error);
            break;
          }
          if (chunk.usage) reply.tokens = chunk.usage.completion_tokens;
          const choice = chunk.choices?.[0];
          if (!choice) continue;
          const delta = choice.delta || {};
          if (delta.reasoning_content) reply.reasoning += delta.reasoning_content;
          if (delta.content) reply.content += delta.content;
          if ((delta.reasoning_content || delta.content) && first === null) first = performance.now();
          if (choice.finish_reason) reply.finish = choice.finish_reason;
          this.fill(view, reply, true);
        }
      }
    } catch (e) {
      if (e.name === "AbortError") reply.finish = "stopped";
      else if (e instanceof NeedKey) reply.error = "This server needs an API key: give it, then regenerate.";
      else reply.error = `The request failed: ${e.message || e}`;
    } finally {
      const ended = performance.now();
      reply.ttftMs = first === null ? null : Math.round(first - started);
      if (reply.tokens && first !== null && ended > first) reply.tokS = (reply.tokens - 1) / ((ended - first) / 1000);
      this.controller = null;
      this.setBusy(false);
      this.save();
      this.renderAll();
    }
  }

  setBusy(busy) {
    this.sendButton.hidden = busy;
    this.stopButton.hidden = !busy;
    this.list.setAttribute("aria-busy", String(busy));
    if (!busy) this.prompt.focus();
  }

  renderAll() {
    this.list.replaceChildren(...this.state.messages.map((m, i) =>
      this.messageView(m, i === this.state.messages.length - 1)));
    this.list.scrollTop = this.list.scrollHeight;
  }

  messageView(message, last) {
    const view = document.createElement("article");
    view.className = `msg ${message.role}`;
    const make = (tag, className) => Object.assign(document.createElement(tag), { className });
    const parts = view.parts = { content: make("div", "content") };  // what fill() writes, found once
    if (message.role === "assistant") {
      parts.reasoning = make("details", "reasoning");
      parts.summary = document.createElement("summary");
      parts.reasoningText = make("div", "reasoning-text");
      parts.reasoning.append(parts.summary, parts.reasoningText);
      parts.error = make("p", "error");
      parts.stats = make("span", "stats");
      const meta = make("div", "meta");
      const copy = button("Copy", "copy", () => this.copy(message, copy));
      meta.append(parts.stats, copy);
      if (last) meta.append(button("Regenerate", "regenerate", () => this.regenerate()));
      view.append(parts.reasoning, parts.content, parts.error, meta);
    } else {
      view.append(parts.content);
    }
    this.fill(view, message, false);
    return view;
  }

  // writes a message's fields into its view (as text: nothing the model writes is read as HTML);
  // called for every streamed piece, so it only sets what messageView made
  fill(view, message, streaming) {
    const { content, reasoning, summary, reasoningText, error, stats } = view.parts;
    view.dataset.finish = message.finish || "";
    content.textContent = message.content;
    if (message.role !== "assistant") return;
    reasoning.hidden = !message.reasoning;
    summary.textContent = streaming && !message.content ? "Thinking…" : "Reasoning";
    reasoningText.textContent = message.reasoning || "";
    error.hidden = !message.error;
    error.textContent = message.error || "";
    const shown = [];
    if (message.tokens) shown.push(`${message.tokens} tokens`);
    if (message.tokS) shown.push(`${message.tokS.toFixed(1)} tok/s`);
    if (message.ttftMs != null) shown.push(`first token ${message.ttftMs} ms`);
    if (message.finish === "stopped") shown.push("stopped");
    else if (message.finish === "length") shown.push("cut at max tokens");
    stats.textContent = shown.join(" · ");
    if (streaming) this.list.scrollTop = this.list.scrollHeight;
  }

  async copy(message, control) {
    try {
      await navigator.clipboard.writeText(message.content);
      control.textContent = "Copied";
    } catch {
      control.textContent = "Copy failed";
    }
    setTimeout(() => { control.textContent = "Copy"; }, 1500);
  }
}

function button(label, className, onClick) {
  const b = Object.assign(document.createElement("button"), { type: "button", className: `quiet ${className}`,
                                                              textContent: label });
  b.addEventListener("click", onClick);
  return b;
}
