// The server's API as the page uses it: the key (kept in this browser's local storage), fetch with
// it, and server-sent events read from a fetch body (EventSource cannot send an Authorization header).

const KEY_STORE = "strata.apiKey";
const keyWaiters = [];

export class NeedKey extends Error {}

export function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
  keyWaiters.splice(0).forEach((resolve) => resolve());
}

// resolves when a key is set (the caller then retries)
export function keyChanged() {
  return new Promise((resolve) => keyWaiters.push(resolve));
}

let onNeedKey = () => {};
export function whenKeyNeeded(handler) {
  onNeedKey = handler;
}

// fetch a path of this server with the key; 401 asks the user for a key and throws NeedKey
export async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...init, headers });
  if (response.status === 401) {
    onNeedKey(Boolean(key));
    throw new NeedKey("this server needs an API key");
  }
  return response;
}

// the error message of a failed response (OpenAI's error shape), else its status line
export async function errorText(response) {
  try {
    const body = await response.json();
    return body?.error?.message || JSON.stringify(body);
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// yields {event, data} for each server-sent event of a response body
export async function* serverEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let event = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (!line || line.startsWith(":")) continue; // a comment: the server's keep-alive
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") event = text;
          else if (field === "data") data.push(text);
        }
        if (data.length) yield { event, data: data.join("\n") };
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
