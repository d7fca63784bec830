// The page's wiring: the model's name, the views' tabs (on a narrow screen one view shows at a
// time), the API-key dialog, and the connection state in the header.

import { api, apiKey, keyChanged, NeedKey, setApiKey, whenKeyNeeded } from "./api.js";
import { Chat } from "./chat.js";
import { LiveView } from "./live.js";

let modelId = "default";
let firstModel = null; // the server's first model (the live view's without a choice)

async function loadModel() {
  for (;;) {
    try {
      const response = await api("/v1/models");
      if (response.ok) {
        const models = (await response.json()).data || [];
        if (models.length) modelId = firstModel = models[0].id;
        document.getElementById("model").textContent = modelId;
        if (models.length > 1) showModelChoice(models);
        return;
      }
    } catch (e) {
      if (e instanceof NeedKey) {
        await keyChanged();
        continue;
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

// a server of several models (--model NAME=PATH): the chat asks the one chosen here, the live view watches it
function showModelChoice(models) {
  const choice = document.getElementById("model-choice");
  choice.replaceChildren(...models.map((m) => {
    const option = document.createElement("option");
    option.value = m.id;
    option.textContent = m.loaded === false ? `${m.id} (not loaded)` : m.id;
    return option;
  }));
  choice.value = modelId;
  choice.addEventListener("change", () => {
    modelId = choice.value;
    live.watch();
  });
  choice.hidden = false;
  document.getElementById("model").hidden = true;
}

function setLink(state, label) {
  const link = document.getElementById("link");
  link.dataset.state = state;
  link.textContent = label;
}

function setUpKeyDialog() {
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  const keyButton = document.getElementById("key-button");
  const ask = (refused) => {
    keyButton.hidden = false;
    document.getElementById("key-error").hidden = !refused;
    if (!dialog.open) {
      input.value = "";
      dialog.showModal();
    }
  };
  whenKeyNeeded(ask);
  keyButton.addEventListener("click", () => ask(false));
  if (apiKey()) keyButton.hidden = false;
  document.getElementById("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    dialog.close();
    setApiKey(input.value.trim());
  });
}

function setUpTabs() {
  const panes = document.querySelector(".panes");
  const tabs = [...document.querySelectorAll(".tab")];
  const show = (tab) => {
    panes.dataset.show = tab.getAttribute("aria-controls");
    for (const t of tabs) t.setAttribute("aria-selected", String(t === tab));
  };
  for (const tab of tabs) tab.addEventListener("click", () => show(tab));
}

setUpKeyDialog();
setUpTabs();
new Chat(() => modelId);
const live = new LiveView(setLink, () => (firstModel === null || modelId === firstModel ? null : modelId));
live.connect();
loadModel();
document.getElementById("prompt").focus();
