// The page of `tpgen serve`: the same OpenAI images API as any client
// (POST /v1/images/generations or /v1/images/edits with "stream": true),
// its server-sent events read with fetch and a ReadableStream.
"use strict";
const $ = (id) => document.getElementById(id);

function setStatus(text, error) {
  $("status").textContent = text;
  $("status").classList.toggle("error", !!error);
}

// the text chunk "parameters" of a PNG (tEXt or uncompressed iTXt), or ""
function pngParameters(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let at = 8; at + 12 <= bytes.length;) {
    const len = view.getUint32(at), type = String.fromCharCode(...bytes.subarray(at + 4, at + 8));
    const data = bytes.subarray(at + 8, at + 8 + len);
    if (type === "tEXt" || type === "iTXt") {
      const nul = data.indexOf(0);
      const key = new TextDecoder("latin1").decode(data.subarray(0, nul));
      if (key === "parameters") {
        if (type === "tEXt") return new TextDecoder("latin1").decode(data.subarray(nul + 1));
        let p = nul + 3;                       // compression flag and method
        p = data.indexOf(0, p) + 1;            // language tag
        p = data.indexOf(0, p) + 1;            // translated keyword
        return new TextDecoder().decode(data.subarray(p));
      }
    }
    if (type === "IEND") break;
    at += 12 + len;
  }
  return "";
}

function b64Bytes(b64) {
  const s = atob(b64), out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

function headers() {
  const key = $("api-key").value.trim();
  return key ? { Authorization: "Bearer " + key } : {};
}

// the request: JSON for a generation, multipart for an edit (reference images)
function buildRequest(partials) {
  const num = (id) => ($(id).value === "" ? undefined : Number($(id).value));
  const fields = { prompt: $("prompt").value, size: `${num("width")}x${num("height")}`, stream: true,
                   partial_images: partials, steps: num("steps"), seed: num("seed"), guidance: num("guidance") };
  const files = $("images").files;
  if (!files.length) {
    const body = JSON.stringify(fields);
    return { url: "/v1/images/generations", init: { method: "POST", body,
             headers: { ...headers(), "Content-Type": "application/json" } } };
  }
  const form = new FormData();
  for (const [k, v] of Object.entries(fields)) if (v !== undefined) form.append(k, String(v));
  for (const f of files) form.append("image[]", f, f.name);
  return { url: "/v1/images/edits", init: { method: "POST", body: form, headers: headers() } };
}

// server-sent events: "event: T\ndata: JSON\n\n" blocks, handed to onEvent(type, data)
async function readEvents(res, onEvent) {
  const reader = res.body.getReader(), dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let type = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) type = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(type, JSON.parse(data));
    }
  }
}

function addToHistory(src, caption) {
  const li = document.createElement("li");
  const img = document.createElement("img");
  img.src = src;
  img.alt = caption.split("\n")[0];
  const a = document.createElement("a");
  a.href = src;
  a.download = `tpgen-${$("history").children.length + 1}.png`;
  a.textContent = "download";
  const cap = document.createElement("div");
  cap.className = "hint";
  cap.textContent = caption;
  li.append(img, a, cap);
  $("history").prepend(li);
}

async function generate(ev) {
  ev.preventDefault();
  const partials = Math.max(0, Math.min(3, Number($("partials").value) || 0));
  const { url, init } = buildRequest(partials);
  $("generate").disabled = true;
  $("progress").value = 0;
  $("preview").removeAttribute("src");
  setStatus("sending the request");
  const t0 = performance.now();
  let partialsSeen = 0, finished = false;
  try {
    const res = await fetch(url, init);
    if (!res.ok) {
      const body = await res.json().catch(() => ({}));
      const msg = (body.error && body.error.message) || res.statusText;
      setStatus(`${res.status}: ${msg}`, true);
      return;
    }
    setStatus("rendering");
    await readEvents(res, (type, data) => {
      if (type.endsWith("partial_image")) {
        partialsSeen++;
        $("preview").src = "data:image/png;base64," + data.b64_json;
        $("progress").value = partialsSeen / (partials + 1);
        setStatus(`partial image ${data.partial_image_index + 1} of ${partials} (${data.size})`);
      } else if (type.endsWith("completed")) {
        const src = "data:image/png;base64," + data.b64_json;
        const params = pngParameters(b64Bytes(data.b64_json));
        $("result").src = src;
        $("params").textContent = params || data.size;
        $("progress").value = 1;
        finished = true;
        const secs = ((performance.now() - t0) / 1000).toFixed(1);
        setStatus(`done in ${secs} s (${data.size})`);
        addToHistory(src, params || data.size);
      } else if (type === "error") {
        setStatus("error: " + ((data.error && data.error.message) || "the render failed"), true);
        finished = true;
      }
    });
    if (!finished) setStatus("the stream ended without an image", true);
  } catch (e) {
    setStatus("connection failed: " + e.message, true);
  } finally {
    $("generate").disabled = false;
  }
}

async function health() {
  try {
    const res = await fetch("/health");
    const h = await res.json();
    $("model").textContent = h.status === "ready" ? "server ready" : "the model is loading";
  } catch (e) {
    $("model").textContent = "server unreachable";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", generate);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("form").requestSubmit();
  });
  health();
});
