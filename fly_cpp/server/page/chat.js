// fly-cpp's chat page: a multi-turn chat over /v1/chat/completions (streamed), each token
// coloured by how FLy accepted it (the chunks' fly_token), with per-answer statistics.
// Plain JavaScript, no dependencies: it works offline, served by fly-cpp itself.
"use strict";

const $ = (id) => document.getElementById(id);
const SETTINGS = ["system", "mode", "k", "temperature", "max_tokens", "api_key"];
const state = { messages: [], busy: false, abort: null, ready: false };

function load() {
  for (const id of SETTINGS) {
    const saved = localStorage.getItem("fly-cpp." + id);
    if (saved !== null) $(id).value = saved;
    $(id).addEventListener("change", () => localStorage.setItem("fly-cpp." + id, $(id).value));
  }
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function status(text, kind) {
  const pill = $("status");
  pill.textContent = text;
  pill.className = "pill " + (kind || "");
}

async function watchHealth() {
  for (;;) {
    try {
      const res = await fetch("/health", { cache: "no-store" });
      if (res.ok) {
        if (!state.ready) {
          state.ready = true;
          status("ready", "ok");
          showModel();
        }
      } else {
        state.ready = false;
        status(res.status === 503 ? "loading model…" : "error " + res.status, "wait");
      }
    } catch (e) {
      state.ready = false;
      status("server unreachable", "bad");
    }
    await new Promise((r) => setTimeout(r, state.ready ? 5000 : 700));
  }
}

async function showModel() {
  try {
    const res = await fetch("/v1/models", { headers: headers() });
    if (res.status === 401) {
      $("model").textContent = "API key needed (settings)";
      return;
    }
    const data = await res.json();
    const m = data.data[0];
    $("model").textContent = m.id + (m.meta && m.meta.draft ? " + draft " + m.meta.draft : " (n-gram drafts)");
  } catch (e) {
    $("model").textContent = "";
  }
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (text !== undefined) div.textContent = text;
  $("messages").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function numberOrNull(id) {
  const v = $(id).value.trim();
  if (v === "") return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : null;
}

function request() {
  const system = $("system").value.trim();
  const body = {
    messages: (system ? [{ role: "system", content: system }] : []).concat(state.messages),
    stream: true,
    stream_options: { include_usage: true },
    mode: $("mode").value,
  };
  const temperature = numberOrNull("temperature");
  if (temperature !== null) body.temperature = temperature;
  const k = numberOrNull("k");
  if (k !== null) body.k = Math.round(k);
  const max = numberOrNull("max_tokens");
  if (max !== null) body.max_tokens = Math.round(max);
  return body;
}

// SSE: events are separated by a blank line; each of ours is one "data: ..." line
function* events(buffer) {
  let at;
  while ((at = buffer.text.indexOf("\n\n")) >= 0) {
    const raw = buffer.text.slice(0, at);
    buffer.text = buffer.text.slice(at + 2);
    const data = raw.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
    if (data) yield data;
  }
}

function stats(answer, fly, finish, counts) {
  const line = document.createElement("span");
  line.className = "stats";
  const parts = [
    `${fly.n_tokens} tokens`,
    `${fly.tokens_per_second.toFixed(1)} tok/s`,
    `mean accepted ${fly.mean_accepted.toFixed(2)}`,
    `loose ${fly.n_loose}`,
    `exact ${fly.n_exact}`,
    `mode ${fly.mode}`,
  ];
  if (fly.interrupted) parts.push("server stopped it");
  else if (fly.context_full) parts.push("context full");
  else if (finish === "length") parts.push("max tokens");
  line.textContent = parts.join(" · ");
  answer.appendChild(line);
}

async function send(text) {
  state.messages.push({ role: "user", content: text });
  bubble("user", text);
  const answer = bubble("assistant");
  answer.dataset.state = "streaming";
  const body = document.createElement("span");
  body.className = "answer";
  answer.appendChild(body);
  let written = "";
  const counts = { tokens: 0, drafted: 0, loose: 0 };
  state.abort = new AbortController();
  setBusy(true);
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(request()), signal: state.abort.signal,
    });
    if (!res.ok) {
      let message = "HTTP " + res.status;
      try { message = (await res.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(message);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    const buffer = { text: "" };
    let finished = false;
    while (!finished) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer.text += decoder.decode(value, { stream: true });
      for (const data of events(buffer)) {
        if (data === "[DONE]") { finished = true; break; }
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        const choice = chunk.choices && chunk.choices[0];
        const piece = choice && choice.delta && choice.delta.content;
        if (piece) {
          const span = document.createElement("span");
          const flags = chunk.fly_token || {};
          span.className = "tok " + (flags.loose ? "tok-loose" : flags.drafted ? "tok-drafted" : "tok-target");
          span.textContent = piece;
          body.appendChild(span);
          written += piece;
          counts.tokens += 1;
          counts.drafted += flags.drafted ? 1 : 0;
          counts.loose += flags.loose ? 1 : 0;
          answer.scrollIntoView({ block: "end" });
        }
        if (chunk.fly) stats(answer, chunk.fly, choice && choice.finish_reason, counts);
      }
    }
  } catch (e) {
    const err = document.createElement("span");
    err.className = "error";
    err.textContent = e.name === "AbortError" ? " [stopped]" : "error: " + e.message;
    answer.appendChild(err);
    if (e.message && e.message.toLowerCase().includes("api key")) $("api_key").focus();
  } finally {
    if (written) state.messages.push({ role: "assistant", content: written });
    else state.messages.pop(); // nothing came back: the question is not part of the conversation
    setBusy(false);
    answer.dataset.state = "done";
  }
}

function setBusy(busy) {
  state.busy = busy;
  $("send").disabled = busy;
  $("stop").hidden = !busy;
  const last = state.messages[state.messages.length - 1];
  $("regen").hidden = busy || !last || last.role !== "assistant";
}

// the last answer written again in its place (a fresh draw where the request samples), as
// llama-server's web UI regenerates: its question is asked again, the old answer dropped
function regenerate() {
  const n = state.messages.length;
  if (state.busy || n < 2 || state.messages[n - 1].role !== "assistant") return;
  state.messages.pop();
  const question = state.messages.pop().content;
  const list = $("messages");
  for (let i = 0; i < 2 && list.lastChild; i++) list.removeChild(list.lastChild);
  send(question);
}

function main() {
  load();
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("message").value.trim();
    if (!text || state.busy) return;
    $("message").value = "";
    send(text);
  });
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.abort && state.abort.abort());
  $("regen").addEventListener("click", regenerate);
  $("new_chat").addEventListener("click", () => {
    if (state.busy) return;
    state.messages = [];
    $("messages").textContent = "";
    setBusy(false);
  });
  $("api_key").addEventListener("change", showModel);
  watchHealth();
}

main();
