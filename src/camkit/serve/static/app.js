// camkit serve: the explorer's page. Plain JavaScript, no build step, nothing fetched from
// anywhere but this server; every API call carries the token from the page's URL.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const PAGE = 50;
const $ = (id) => document.getElementById(id);
const state = { info: null, offset: 0, image: null, urls: [] };
window.camkitState = state;

function api(path, params = {}) {
  const query = new URLSearchParams({ ...params, token: TOKEN });
  return `api/${path}?${query}`;
}

function showError(text) {
  const box = $("message");
  box.textContent = text || "";
  box.hidden = !text;
}

async function getJSON(path, params) {
  const reply = await fetch(api(path, params));
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.error || reply.statusText);
  return body;
}

// an image from the API as an object URL (so that an error shows its message)
async function getImage(path, params) {
  document.body.dataset.busy = String(+document.body.dataset.busy + 1);
  try {
    const reply = await fetch(api(path, params));
    if (!reply.ok) {
      const body = await reply.json().catch(() => ({}));
      throw new Error(body.error || reply.statusText);
    }
    const url = URL.createObjectURL(await reply.blob());
    state.urls.push(url);
    return url;
  } finally {
    document.body.dataset.busy = String(+document.body.dataset.busy - 1);
  }
}

function element(tag, attributes = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function percent(p) { return `${(100 * p).toFixed(1)}%`; }

function classOf(text) {
  const labels = state.info.labels;
  const value = (text || "").trim();
  if (value === "") return null;
  if (/^\d+$/.test(value) && +value < labels.length) return +value;
  const exact = labels.findIndex((label) => label.toLowerCase() === value.toLowerCase());
  if (exact >= 0) return exact;
  const inside = labels.map((l, i) => [l, i]).filter(([l]) => l.toLowerCase().includes(value.toLowerCase()));
  if (inside.length === 1) return inside[0][1];
  throw new Error(`"${value}" is not one class of this model (${inside.length} match)`);
}

function classText(index) { return `${state.info.labels[index]} (${index})`; }
function parseClassText(text) {
  const match = /\((\d+)\)\s*$/.exec(text || "");
  return match ? +match[1] : classOf(text);
}

// ------------------------------------------------------------------ gallery

async function loadGallery() {
  const params = { offset: state.offset, limit: PAGE, order: $("f-order").value };
  const predicted = $("f-predicted").value.trim();
  if (predicted) params.predicted = state.info.labels[parseClassText(predicted)] ?? predicted;
  if ($("f-truth").value) params.truth = $("f-truth").value;
  if ($("f-wrong").checked) params.wrong = 1;
  const page = await getJSON("gallery", params);
  const gallery = $("gallery");
  gallery.replaceChildren();
  for (const item of page.items) {
    const top = item.top[0];
    const card = element("div", { class: "card", "data-id": item.id }, [
      item.error ? element("div", { class: "unreadable", text: "unreadable" })
        : element("img", { src: api(`thumb/${item.id}`), loading: "lazy", alt: item.name }),
      element("div", { class: "name", text: item.name, title: item.name }),
      element("div", {
        class: "pred",
        text: item.error ? `unreadable: ${item.error}` : top ? `${top.label} ${percent(top.probability)}` : "",
      }),
    ]);
    if (item.truth && top && item.truth.toLowerCase() !== top.label.toLowerCase()) card.classList.add("wrong");
    card.addEventListener("click", () => { location.hash = `image=${item.id}`; });
    gallery.append(card);
  }
  const last = Math.min(page.offset + PAGE, page.total);
  $("count").textContent = page.total
    ? `${page.offset + 1}–${last} of ${page.total}` + (page.predicted < page.images ? ` (${page.predicted} of ${page.images} predicted)` : "")
    : "no images match";
  $("prev").disabled = page.offset === 0;
  $("next").disabled = last >= page.total;
}

// ------------------------------------------------------------------ image view

function mapParams(extra = {}) {
  return {
    image: state.image,
    class: state.cls,
    method: $("method").value,
    layer: $("layer").value,
    alpha: $("alpha").value,
    colormap: $("colormap").value,
    ...extra,
  };
}

async function openImage(id, wanted = {}) {
  state.image = id;
  const info = await getJSON(`image/${id}`, { k: 5 });
  state.imageInfo = info;
  $("image-name").textContent = info.name + (info.truth ? ` (true class: ${info.truth})` : "");
  $("photo").src = await getImage(`photo/${id}`);
  const table = $("top");
  table.replaceChildren();
  for (const row of info.top) {
    const tr = element("tr", { class: "pick", title: "explain this class" }, [
      element("td", { text: `${row.label} (${row.index})` }),
      element("td", { class: "p", text: percent(row.probability) }),
    ]);
    tr.addEventListener("click", () => { $("class").value = classText(row.index); updateMaps(); });
    table.append(tr);
  }
  const runMaps = $("run-maps");
  runMaps.replaceChildren();
  for (const map of info.run_maps) {
    const link = element("a", { href: api(`run/${encodeURI(map.output)}`), target: "_blank", class: "run-map",
      text: `run: ${map.method} · ${map.layer || "no layer"} · ${map.label}` });
    runMaps.append(link, element("br"));
  }
  $("class").value = classText(wanted.class ?? info.top[0].index);
  if (wanted.method && state.info.methods.some((m) => m.name === wanted.method)) $("method").value = wanted.method;
  $("class2").value = "";
  $("depth").replaceChildren();
  $("curves").replaceChildren();
  await updateMaps();
}

function probabilityOf(index) {
  const p = state.imageInfo.probabilities[index];
  return p === undefined ? "" : ` ${percent(p)}`;
}

async function updateMaps() {
  showError("");
  let second;
  try {
    state.cls = parseClassText($("class").value);
    second = parseClassText($("class2").value);
  } catch (error) { showError(error.message); return; }
  if (state.cls === null) return;
  const method = state.info.methods.find((m) => m.name === $("method").value);
  $("layer").disabled = !method.needs_layer;
  const panels = [[state.cls, state.info.checkpoints[0]]];
  if (second !== null && second !== undefined) panels.push([second, state.info.checkpoints[0]]);
  if ($("compare").checked) panels.push(...panels.map(([c]) => [c, state.info.checkpoints[1]]));
  const figures = panels.map(([cls, checkpoint]) => {
    const caption = `${classText(cls)}${probabilityOf(cls)} · ${method.name}` +
      (method.needs_layer ? ` · ${$("layer").value}` : "") +
      (state.info.checkpoints.length > 1 ? ` · checkpoint ${checkpoint}` : "");
    return element("figure", {}, [element("img", { class: "map", alt: caption }), element("figcaption", { text: caption })]);
  });
  $("maps").replaceChildren(...figures);
  const main = mapParams();
  $("download-png").href = api("map", main);
  $("download-png").download = `map_${main.method}_${main.class}.png`;
  $("download-npy").href = api("map", { ...main, format: "npy" });
  $("download-npy").download = `map_${main.method}_${main.class}.npy`;
  try {
    await Promise.all(panels.map(async ([cls, checkpoint], i) => {
      figures[i].querySelector("img").src = await getImage("map", mapParams({ class: cls, checkpoint }));
    }));
  } catch (error) { showError(error.message); }
}

async function depthStrip() {
  showError("");
  const strip = $("depth");
  strip.replaceChildren(element("span", { text: "computing the depth strip..." }));
  try {
    const reply = await getJSON("depth", mapParams());
    const figures = await Promise.all(reply.layers.map(async (layer) => element("figure", {}, [
      element("img", { src: await getImage("map", mapParams({ layer })), alt: layer }),
      element("figcaption", { text: layer + (layer === state.info.default_layer ? " (default)" : "") }),
    ])));
    strip.replaceChildren(...figures);
  } catch (error) { strip.replaceChildren(); showError(error.message); }
}

function plot(curves) {
  const width = 320, height = 180, pad = 28;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  const colours = { deletion: "#c0392b", insertion: "#2864c8" };
  let y = 16;
  for (const [name, { auc, curve }] of Object.entries(curves)) {
    const points = curve.map((v, i) => `${pad + (i / (curve.length - 1)) * (width - 2 * pad)},${height - pad - v * (height - 2 * pad)}`);
    const line = document.createElementNS(svg.namespaceURI, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", colours[name]); line.setAttribute("stroke-width", "2");
    const label = document.createElementNS(svg.namespaceURI, "text");
    label.setAttribute("x", width - pad - 120); label.setAttribute("y", y); y += 16;
    label.setAttribute("fill", colours[name]); label.setAttribute("font-size", "12");
    label.textContent = `${name} AUC ${auc.toFixed(3)}`;
    svg.append(line, label);
  }
  const axis = document.createElementNS(svg.namespaceURI, "path");
  axis.setAttribute("d", `M${pad},${pad} V${height - pad} H${width - pad}`);
  axis.setAttribute("stroke", "#66707c"); axis.setAttribute("fill", "none");
  svg.append(axis);
  return svg;
}

async function curves() {
  showError("");
  $("curves").replaceChildren(element("span", { text: "scoring..." }));
  try {
    $("curves").replaceChildren(plot(await getJSON("curve", mapParams())));
  } catch (error) { $("curves").replaceChildren(); showError(error.message); }
}

// ------------------------------------------------------------------ set-up

async function route() {
  const match = /^#image=(\d+)(?:&class=(\d+))?(?:&method=([\w+-]+))?$/.exec(location.hash);
  const strategies = location.hash === "#strategies";
  $("gallery-view").hidden = !!match || strategies;
  $("image-view").hidden = !match;
  $("strategies-view").hidden = !strategies;
  for (const url of state.urls.splice(0)) URL.revokeObjectURL(url);
  try {
    if (match) await openImage(+match[1], { class: match[2] && +match[2], method: match[3] });
    else if (strategies) await loadStrategies();
    else await loadGallery();
  } catch (error) { showError(error.message); }
}

// ------------------------------------------------------------------ strategies

function figureNumber(value, digits = 2) {
  return value === null || value === undefined ? "–" : (+value).toFixed(digits);
}

async function loadStrategies() {
  const data = await getJSON("strategies");
  const groups = data.groups.map((group) => {
    const clusters = [...group.clusters].sort((a, b) => (b.suspiciousness ?? 0) - (a.suspiciousness ?? 0));
    const link = (id) => element("a", { href: `#image=${id}&class=${group.class}&method=${group.method}` }, [
      element("img", { src: api(`thumb/${id}`), loading: "lazy", alt: `image ${id}` }),
    ]);
    return element("section", { class: "group" }, [
      element("h3", { text: `${group.label} (${group.class}) · ${group.method} · ${group.samples} maps · ${clusters.length} clusters` }),
      element("div", { class: "clusters" }, clusters.map((cluster, rank) => element("div", {
        class: "cluster" + (rank === 0 && clusters.length > 1 ? " suspicious" : ""),
      }, [
        cluster.prototype ? element("img", { class: "prototype", src: api(`run/${encodeURI(cluster.prototype)}`), alt: "prototype" }) : "",
        element("div", { text: `cluster ${cluster.id}: ${cluster.size} images` }),
        element("div", { text: `confidence ${figureNumber(cluster.confidence)}, accuracy ${figureNumber(cluster.accuracy)}` }),
        element("div", { text: `suspiciousness ${figureNumber(cluster.suspiciousness, 3)}` }),
        element("div", { class: "members", title: "typical members" }, cluster.typical.map(link)),
        element("div", { class: "members", title: "atypical members" }, cluster.atypical.map(link)),
      ]))),
    ]);
  });
  const skipped = data.skipped.length ? [element("p", { class: "note", text: `${data.skipped.length} class(es) skipped: too few maps` })] : [];
  $("strategies").replaceChildren(...groups, ...skipped);
}

async function upload(file) {
  showError("");
  try {
    const reply = await fetch(api("upload", { name: file.name }), { method: "POST", body: file });
    const body = await reply.json();
    if (!reply.ok) throw new Error(body.error || reply.statusText);
    location.hash = `image=${body.id}`;
  } catch (error) { showError(`upload refused: ${error.message}`); }
}

async function start() {
  try {
    state.info = await getJSON("info");
  } catch (error) { showError(error.message); return; }
  const info = state.info;
  $("model").textContent = `${info.model} · ${info.images} images` + (info.checkpoints.length > 1 ? " · two checkpoints" : "");
  $("labels").replaceChildren(...info.labels.map((label, i) => element("option", { value: `${label} (${i})` })));
  if (info.truths.length) {
    $("f-truth-box").hidden = false;
    $("f-truth").append(...info.truths.map((t) => element("option", { value: t, text: t })));
  }
  const families = {};
  for (const method of info.methods) (families[method.family] ||= []).push(method);
  for (const [family, methods] of Object.entries(families)) {
    $("method").append(element("optgroup", { label: family }, methods.map((m) =>
      element("option", { value: m.name, text: m.name + (m.slow ? " (slow)" : ""), title: m.reference }))));
  }
  if (info.methods.some((m) => m.name === "gradcam")) $("method").value = "gradcam";
  $("layer").append(...info.layers.map((layer) => element("option", {
    value: layer.name,
    text: `${layer.name === info.default_layer ? "★ " : ""}${layer.name} ${JSON.stringify(layer.shape.slice(1))}`,
  })));
  $("layer").value = info.default_layer;
  $("colormap").append(...info.colormaps.map((c) => element("option", { value: c, text: c })));
  $("compare-box").hidden = info.checkpoints.length < 2;
  $("strategies-link").hidden = !info.strategies;

  for (const id of ["f-order", "f-truth", "f-wrong", "f-predicted"]) {
    $(id).addEventListener("change", () => { state.offset = 0; loadGallery().catch((e) => showError(e.message)); });
  }
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); loadGallery(); });
  $("next").addEventListener("click", () => { state.offset += PAGE; loadGallery(); });
  for (const id of ["class", "class2", "method", "layer", "alpha", "colormap", "compare"]) {
    $(id).addEventListener("change", updateMaps);
  }
  $("back").addEventListener("click", () => { location.hash = ""; });
  $("depth-button").addEventListener("click", depthStrip);
  $("curve-button").addEventListener("click", curves);
  $("file").addEventListener("change", () => { if ($("file").files[0]) upload($("file").files[0]); });
  const drop = $("drop");
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault(); drop.classList.remove("over");
    if (event.dataTransfer.files[0]) upload(event.dataTransfer.files[0]);
  });
  window.addEventListener("hashchange", route);
  await route();
  document.body.dataset.ready = "1";
}

start();
