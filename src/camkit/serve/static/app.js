// camkit serve: the explorer's page. Plain JavaScript, no build step, nothing fetched from
// anywhere but this server; every API call carries the token from the page's URL.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const PAGE = 50;
const $ = (id) => document.getElementById(id);
const state = { info: null, offset: 0, image: null, urls: [], jobs: new Set(), shown: null };
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

// Each view shows the answer to its latest request only: latest(view) aborts the view's request
// before (the server stops a long map's work too) and gives the signal of the new one; an answer
// to a request that is no longer the latest rejects with an AbortError (stale), which the view
// drops, whatever the order the answers arrive in.
const requests = new Map();

function latest(view) {
  forget(view);
  const controller = new AbortController();
  requests.set(view, controller);
  return controller.signal;
}

function forget(view) { requests.get(view)?.abort(); }
function stale(error) { return error?.name === "AbortError"; }
function failed(error) { if (!stale(error)) showError(error.message); }

// one API request (body.dataset.busy counts those in flight), read by `read` from its reply;
// an error's JSON message as the Error's; a stale one rejects with an AbortError
async function call(path, params, signal, read) {
  document.body.dataset.busy = String(+document.body.dataset.busy + 1);
  try {
    const reply = await fetch(api(path, params), { signal });
    if (!reply.ok) {
      const body = await reply.json().catch(() => ({}));
      throw new Error(body.error || reply.statusText);
    }
    const value = await read(reply);
    signal?.throwIfAborted();
    return value;
  } catch (error) {
    signal?.throwIfAborted();
    throw error;
  } finally {
    document.body.dataset.busy = String(+document.body.dataset.busy - 1);
  }
}

function getJSON(path, params, signal) { return call(path, params, signal, (reply) => reply.json()); }

// an image from the API as an object URL (so that an error shows its message), with the
// reply's headers
function fetchImage(path, params, signal) {
  return call(path, params, signal, async (reply) => {
    const url = URL.createObjectURL(await reply.blob());
    state.urls.push(url);
    return { url, headers: reply.headers };
  });
}

async function getImage(path, params, signal) { return (await fetchImage(path, params, signal)).url; }

// an image computed on demand: a placeholder (a spinner) in its place until it comes, the
// reason where none comes; never a broken-image icon
function pendingImage(attributes) {
  return [element("div", { class: "pending", text: "computing..." }), element("img", { ...attributes, hidden: "" })];
}

async function fill(img, url) {
  const placeholder = img.previousElementSibling;
  try {
    img.src = await url;
    img.hidden = false;
    placeholder?.remove();
  } catch (error) {
    if (placeholder && !stale(error)) {
      placeholder.classList.add("failed");
      placeholder.textContent = `no image: ${error.message}`;
    }
    throw error;
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
function nameOf(checkpoint) { return state.info.names[checkpoint] || checkpoint; }
function comparing() { return state.info.checkpoints.length > 1; }
function stem(name) { return name.split("/").pop().replace(/\.[^.]*$/, ""); }
function seconds(s) { return s < 1 ? "<1 s" : s < 90 ? `~${Math.round(s)} s` : `~${Math.round(s / 60)} min`; }
function parseClassText(text) {
  const match = /\((\d+)\)\s*$/.exec(text || "");
  return match ? +match[1] : classOf(text);
}

// ------------------------------------------------------------------ gallery

async function loadGallery() {
  const signal = latest("gallery");
  const params = { offset: state.offset, limit: PAGE, order: $("f-order").value };
  const predicted = $("f-predicted").value.trim();
  if (predicted) params.predicted = state.info.labels[parseClassText(predicted)] ?? predicted;
  if ($("f-truth").value) params.truth = $("f-truth").value;
  if ($("f-wrong").checked) params.wrong = 1;
  if (comparing()) {
    params.checkpoint = $("f-checkpoint").value;
    if ($("f-changed").checked) params.changed = 1;
  }
  const page = await getJSON("gallery", params, signal);
  const gallery = $("gallery");
  gallery.replaceChildren();
  for (const item of page.items) {
    const top = item.top[0];
    const card = element("div", { class: "card", "data-id": item.id }, [
      item.error ? element("div", { class: "unreadable", text: "unreadable" })
        : element("img", { src: api(`thumb/${item.id}`), loading: "lazy", alt: item.name }),
      element("div", { class: "name", text: item.name, title: item.name }),
      item.tops && !item.error
        ? element("div", { class: "pred" }, Object.entries(item.tops).map(([c, [t]]) => element("span", {
          class: "other", text: t ? `${nameOf(c)}: ${t.label} ${percent(t.probability)}` : `${nameOf(c)}: …`,
        })))
        : element("div", {
          class: "pred",
          text: item.error ? `unreadable: ${item.error}` : top ? `${top.label} ${percent(top.probability)}` : "",
        }),
    ]);
    if (item.disagreement) {
      const d = item.disagreement;
      card.title = `confidence moved ${percent(d.confidence_moved)}, map moved ${d.map_moved.toFixed(2)} (1 − Spearman)`;
    }
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
  const method = state.info.methods.find((m) => m.name === $("method").value);
  return {
    image: state.image,
    class: state.cls,
    method: $("method").value,
    layer: $("layer").value,
    ...(method?.takes_composite ? { composite: $("composite").value } : {}),
    alpha: $("alpha").value,
    colormap: $("colormap").value,
    ...extra,
  };
}

async function openImage(id, wanted = {}) {
  const signal = latest("image");
  const infos = {};
  for (const checkpoint of state.info.checkpoints) {
    infos[checkpoint] = await getJSON(`image/${id}`, { k: 5, checkpoint }, signal);
  }
  state.image = id;
  state.imageInfos = infos;
  const info = state.imageInfos[state.info.checkpoints[0]];
  state.imageInfo = info;
  $("image-name").textContent = info.name + (info.truth ? ` (true class: ${info.truth})` : "");
  $("photo").src = await getImage(`photo/${id}`, {}, signal);
  const tops = $("tops");
  tops.replaceChildren();
  for (const [checkpoint, each] of Object.entries(state.imageInfos)) {
    const table = element("table", { class: "top", "data-checkpoint": checkpoint });
    for (const row of each.top) {
      const tr = element("tr", { class: "pick", title: "explain this class" }, [
        element("td", { text: `${row.label} (${row.index})` }),
        element("td", { class: "p", text: percent(row.probability) }),
      ]);
      tr.addEventListener("click", () => { $("class").value = classText(row.index); updateMaps(); });
      table.append(tr);
    }
    if (comparing()) tops.append(element("h4", { text: `top-5 of ${nameOf(checkpoint)}` }));
    tops.append(table);
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
  state.shown = null;
  await refreshMethods(signal);
  await updateMaps();
}

// each checkpoint's own probability of a class, and its own top-1
function probabilityOf(index, checkpoint) {
  const p = state.imageInfos[checkpoint].probabilities[index];
  return p === undefined ? "" : ` ${percent(p)}`;
}

function topOf(checkpoint) {
  const best = state.imageInfos[checkpoint].top[0];
  return best ? `top-1 ${best.label} ${percent(best.probability)}` : "";
}

// a map image that may take long: progress from the server, and a cancel that stops the work
async function longImage(path, params, signal) {
  const job = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
  state.jobs.add(job);
  const stop = () => fetch(api("cancel", { job }), { method: "POST" });  // a stale map's work
  signal.addEventListener("abort", stop);
  const box = $("progress");
  let timer = setTimeout(async function poll() {
    try {
      const p = await getJSON("progress", { job });
      if (p.job && !p.finished) {
        box.hidden = false;
        $("progress-bar").value = p.expected ? Math.min(p.done / p.expected, 0.99) : 0;
        $("progress-text").textContent = `${params.method}: ${p.done}${p.expected ? ` of ~${p.expected}` : ""} copies scored, ${p.seconds.toFixed(1)} s`;
      }
    } catch (error) { /* the map's own request reports errors */ }
    if (timer !== null) timer = setTimeout(poll, 250);
  }, 250);
  try {
    return await fetchImage(path, { ...params, job }, signal);
  } finally {
    signal.removeEventListener("abort", stop);
    clearTimeout(timer); timer = null;
    state.jobs.delete(job);
    if (!state.jobs.size) box.hidden = true;
  }
}

// a slow method's map alone, with progress and cancel; the others batched with the rest
// ({ url, headers })
function fetchMap(params, signal) {
  const method = state.info.methods.find((m) => m.name === params.method);
  const slow = method && (method.slow || (method.seconds ?? 0) > 0.5);
  return slow ? longImage("map", params, signal) : fetchImage("map", params, signal);
}

// what the method measured of its map (LRP: the share of the score that reaches the input
// and where most of it is lost), for the caption; "" when nothing
function measuredText(headers) {
  const raw = headers.get("X-Camkit-Measured");
  const found = raw ? JSON.parse(raw).conservation : null;
  if (!found || found.input === null) return "";
  const [above, stage] = found.lost_most.between;
  return ` · ${(100 * found.input).toPrecision(3)}% of the score reaches the input ` +
    `(most lost between ${above} and ${stage})`;
}

async function cancelMaps() {
  const jobs = [...state.jobs];
  await Promise.all(jobs.map((job) => fetch(api("cancel", { job }), { method: "POST" })));
}

async function updateMaps() {
  const signal = latest("maps");
  showError("");
  let second;
  try {
    state.cls = parseClassText($("class").value);
    second = parseClassText($("class2").value);
  } catch (error) { showError(error.message); return; }
  if (state.cls === null) return;
  const method = state.info.methods.find((m) => m.name === $("method").value);
  $("layer").disabled = !method.needs_layer;
  $("composite-box").hidden = !method.takes_composite;
  const composite = method.takes_composite ? $("composite").value : null;
  const [first, other] = state.info.checkpoints;
  const both = comparing() && $("compare").checked;
  // the depth strip and the curves belong to one class and method: cleared when those change
  const shown = { cls: state.cls, method: method.name, layer: $("layer").value, composite, both };
  const before = state.shown || {};
  const clear = (view) => { forget(view); $(view).replaceChildren(); };
  if (before.cls !== shown.cls || before.method !== shown.method) clear("depth");
  if (Object.keys(shown).some((key) => before[key] !== shown[key])) clear("curves");
  if (before.cls !== shown.cls || before.layer !== shown.layer) clear("concepts");
  state.shown = shown;
  const panels = [[state.cls, first]];
  if (second !== null && second !== undefined) panels.push([second, first]);
  if (both) panels.push(...panels.map(([c]) => [c, other]));
  const figures = panels.map(([cls, checkpoint]) => {
    const caption = `${classText(cls)}${probabilityOf(cls, checkpoint)} · ${method.name}` +
      (method.needs_layer ? ` · ${$("layer").value}` : "") + (composite ? ` · ${composite}` : "") +
      (comparing() ? ` · ${nameOf(checkpoint)} (${topOf(checkpoint)})` : "");
    return element("figure", { "data-checkpoint": checkpoint, "data-class": cls }, [
      ...pendingImage({ class: "map", alt: caption }), element("figcaption", { text: caption })]);
  });
  const differences = both ? panels.filter(([, c]) => c === first).map(([cls]) => element("figure", { class: "difference" }, [
    ...pendingImage({ class: "difference", alt: "difference" }),
    element("figcaption", { text: `difference for ${classText(cls)}: ${nameOf(first)} − ${nameOf(other)} ` +
      "(red: only the first looks there, blue: only the second, white: same heat)" }),
  ])) : [];
  $("maps").replaceChildren(...figures, ...differences);
  $("downloads").replaceChildren(...downloads(both ? [first, other] : [first]));
  try {
    await Promise.all([
      ...panels.map(([cls, checkpoint], i) =>
        fill(figures[i].querySelector("img"), fetchMap(mapParams({ class: cls, checkpoint }), signal)
          .then(({ url, headers }) => {
            figures[i].querySelector("figcaption").textContent += measuredText(headers);
            return url;
          }))),
      ...differences.map((figure, i) =>
        fill(figure.querySelector("img"), getImage("difference", differenceParams(panels[i][0]), signal))),
    ]);
  } catch (error) { failed(error); }
  await updateClip();
}

function differenceParams(cls) {
  const params = mapParams({ class: cls });
  delete params.colormap;
  return params;
}

// the shown class's map of each checkpoint shown (PNG overlay and raw .npy), and with two their
// difference; the first checkpoint's links are #download-png and #download-npy
function downloads(checkpoints) {
  const main = mapParams();
  const name = `${stem(state.imageInfo.name)}_${main.method}_${main.class}`;
  const two = checkpoints.length > 1;
  const link = (what, route, params, file, text, id) => element("a", {
    ...(id ? { id } : {}), class: "download", "data-what": what, href: api(route, params), download: file, text,
  });
  const links = checkpoints.flatMap((checkpoint, k) => {
    const params = { ...main, checkpoint };
    const file = two ? `${name}_${stem(nameOf(checkpoint))}` : name;
    const whose = two ? `${nameOf(checkpoint)}: ` : "";
    return [
      link(checkpoint, "map", params, `${file}.png`, `${whose}overlay (PNG)`, k ? null : "download-png"),
      link(checkpoint, "map", { ...params, format: "npy" }, `${file}.npy`, `${whose}raw map (.npy)`, k ? null : "download-npy"),
    ];
  });
  if (two) {
    const params = differenceParams(main.class);
    const file = `${name}_${stem(nameOf(checkpoints[0]))}-minus-${stem(nameOf(checkpoints[1]))}`;
    links.push(
      link("difference", "difference", params, `${file}.png`, "difference (PNG)"),
      link("difference", "difference", { ...params, format: "npy" }, `${file}.npy`, "difference (.npy)"));
  }
  return links;
}

// the methods menu with roughly how long each takes on this model (measured once it predicted)
async function refreshMethods(signal) {
  try { state.info.methods = (await getJSON("info", {}, signal)).methods; } catch (error) { signal.throwIfAborted(); return; }
  for (const m of state.info.methods) {
    const option = $("method").querySelector(`option[value="${CSS.escape(m.name)}"]`);
    if (option) option.textContent = m.name + (m.seconds !== null ? ` (${seconds(m.seconds)})` : m.slow ? " (slow)" : "");
  }
}

async function depthStrip() {
  const signal = latest("depth");
  showError("");
  const strip = $("depth");
  strip.replaceChildren(element("span", { text: "computing the depth strip..." }));
  try {
    const reply = await getJSON("depth", mapParams(), signal);
    const figures = await Promise.all(reply.layers.map(async (layer) => element("figure", {}, [
      element("img", { src: await getImage("map", mapParams({ layer }), signal), alt: layer }),
      element("figcaption", { text: `${layer}${layer === state.info.default_layer ? " (default)" : ""} · ${classText(state.cls)} · ${$("method").value}` }),
    ])));
    strip.replaceChildren(...figures);
  } catch (error) { if (!stale(error)) { strip.replaceChildren(); showError(error.message); } }
}

// ------------------------------------------------------------------ video clips

// A video model's map is one per frame of the whole video, explained window by window
// (api/map?frame=t, all frames on the video's one colour scale): the clip view plays the
// overlay frame by frame, and its timeline shows each frame's share of the map and where each
// window starts (api/frames); clicking a frame shows that frame's map.
const clip = { urls: [], importance: [], windows: [], fps: null, frame: 0, timer: null };

async function updateClip() {
  const view = $("clip-view");
  view.hidden = !state.info.clip_length;
  if (view.hidden) return;
  const signal = latest("clip");
  pauseClip();
  const params = mapParams();
  try {
    const found = await getJSON("frames", params, signal);
    const urls = await Promise.all(found.importance.map((_, t) => getImage("map", { ...params, frame: t }, signal)));
    Object.assign(clip, { urls, importance: found.importance, windows: found.windows, fps: found.fps });
    $("timeline").replaceChildren(timeline(found.importance, found.windows));
    showFrame(0);
  } catch (error) { failed(error); }
}

// one bar per frame, as high as the frame's share of the map, a tick where each window starts;
// a click shows that frame
function timeline(importance, windows) {
  const width = 480, height = 90, pad = 16, step = (width - 2 * pad) / importance.length;
  const top = Math.max(...importance, 1e-12);
  const svg = svgNode("svg", { width, height, class: "timeline" });
  importance.forEach((share, t) => {
    const bar = (height - 2 * pad) * share / top;
    const rect = svgNode("rect", { x: pad + t * step + 0.5, y: height - pad - bar, width: Math.max(step - 1, 1),
      height: Math.max(bar, 1), class: "frame", "data-frame": t });
    rect.append(svgNode("title", {}, `frame ${t}: ${percent(share)} of the map`));
    rect.addEventListener("click", () => { pauseClip(); showFrame(t); });
    svg.append(rect);
  });
  windows.forEach(([start, stop], i) => {
    const x = pad + start * step;
    const tick = svgNode("line", { x1: x, x2: x, y1: pad / 2, y2: height - pad, class: "window", "data-window": i });
    tick.append(svgNode("title", {}, `window ${i}: frames ${start}..${Math.min(stop, importance.length) - 1}`));
    svg.append(tick);
  });
  svg.append(svgNode("text", { x: pad, y: height - 3, "font-size": 10 }, "frame 0"));
  svg.append(svgNode("text", { x: width - pad, y: height - 3, "font-size": 10, "text-anchor": "end" },
    `${importance.length - 1}`));
  return svg;
}

function showFrame(t) {
  clip.frame = t;
  $("clip-frame").src = clip.urls[t];
  $("clip-frame").dataset.frame = String(t);
  const seconds = clip.fps ? ` · ${(t / clip.fps).toFixed(2)} s` : "";
  const part = clip.windows.findLastIndex(([start]) => start <= t);
  $("clip-label").textContent = `frame ${t} of 0..${clip.urls.length - 1}${seconds} · window ${part} of ${clip.windows.length} · ${percent(clip.importance[t])} of the map`;
  for (const rect of $("timeline").querySelectorAll("rect.frame")) rect.classList.toggle("current", rect.dataset.frame === String(t));
}

function pauseClip() {
  clearInterval(clip.timer);
  clip.timer = null;
  $("clip-play").textContent = "play";
}

function playClip() {
  if (clip.timer !== null) { pauseClip(); return; }
  if (!clip.urls.length) return;
  clip.timer = setInterval(() => showFrame((clip.frame + 1) % clip.urls.length), 1000 / (clip.fps || 8));
  $("clip-play").textContent = "pause";
}

function svgNode(tag, attributes, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// deletion/insertion curves: x the fraction of pixels deleted or inserted, y the probability of
// the class, both with ticks
function plot(curves, title) {
  const width = 380, height = 240, left = 46, right = 12, top = 26, bottom = 40;
  const X = (f) => left + f * (width - left - right), Y = (v) => height - bottom - v * (height - top - bottom);
  const svg = svgNode("svg", { width, height, class: "curves" });
  svg.append(svgNode("text", { x: left, y: 14, "font-size": 12, class: "title" }, title));
  svg.append(svgNode("path", { d: `M${X(0)},${Y(1)} V${Y(0)} H${X(1)}`, stroke: "#66707c", fill: "none" }));
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    svg.append(svgNode("line", { x1: X(t), x2: X(t), y1: Y(0), y2: Y(0) + 4, stroke: "#66707c" }));
    svg.append(svgNode("text", { x: X(t), y: Y(0) + 15, "font-size": 10, "text-anchor": "middle", class: "xtick" }, String(t)));
    svg.append(svgNode("line", { x1: X(0) - 4, x2: X(0), y1: Y(t), y2: Y(t), stroke: "#66707c" }));
    svg.append(svgNode("text", { x: X(0) - 6, y: Y(t) + 3, "font-size": 10, "text-anchor": "end", class: "ytick" }, String(t)));
  }
  svg.append(svgNode("text", { x: (X(0) + X(1)) / 2, y: height - 6, "font-size": 11, "text-anchor": "middle", class: "xlabel" },
    "fraction of pixels deleted / inserted (most important first)"));
  svg.append(svgNode("text", { x: 12, y: (Y(0) + Y(1)) / 2, "font-size": 11, "text-anchor": "middle", class: "ylabel",
    transform: `rotate(-90 12 ${(Y(0) + Y(1)) / 2})` }, "probability of the class"));
  const colours = { deletion: "#c0392b", insertion: "#2864c8" };
  let y = top + 12;
  for (const [name, { auc, curve }] of Object.entries(curves)) {
    const points = curve.map((v, i) => `${X(i / (curve.length - 1))},${Y(v)}`);
    svg.append(svgNode("polyline", { points: points.join(" "), fill: "none", stroke: colours[name], "stroke-width": 2 }));
    svg.append(svgNode("text", { x: X(1) - 130, y, fill: colours[name], "font-size": 12 }, `${name} AUC ${auc.toFixed(3)}`));
    y += 16;
  }
  return svg;
}

async function curves() {
  const signal = latest("curves");
  showError("");
  $("curves").replaceChildren(element("span", { text: "scoring..." }));
  try {
    const title = `${classText(state.cls)} · ${$("method").value}` +
      (comparing() ? ` · ${nameOf(state.info.checkpoints[0])}` : "");
    $("curves").replaceChildren(plot(await getJSON("curve", mapParams(), signal), title));
  } catch (error) { if (!stale(error)) { $("curves").replaceChildren(); showError(error.message); } }
}

// ------------------------------------------------------------------ concepts

// where on a map image the mouse is, as fractions of its width and height
function pointOn(img, event) {
  const r = img.getBoundingClientRect();
  const clip = (v) => Math.min(Math.max(v, 0), 1);
  return [clip((event.clientX - r.left) / r.width), clip((event.clientY - r.top) / r.height)];
}

// a rectangle over a map image, from fractions [x0, y0, x1, y1] of it
function drawMark(img, [x0, y0, x1, y1]) {
  for (const old of document.querySelectorAll("#maps .mark")) old.remove();
  const mark = element("div", { class: "mark" });
  const [left, right] = [Math.min(x0, x1), Math.max(x0, x1)], [top, bottom] = [Math.min(y0, y1), Math.max(y0, y1)];
  Object.assign(mark.style, {
    left: `${img.offsetLeft + left * img.clientWidth}px`, top: `${img.offsetTop + top * img.clientHeight}px`,
    width: `${Math.max((right - left) * img.clientWidth, 2)}px`, height: `${Math.max((bottom - top) * img.clientHeight, 2)}px`,
  });
  img.closest("figure").append(mark);
}

// press on a map: a click asks for the concepts in the layer cell under it, a drag in the box
function startRegion(event) {
  const img = event.target;
  if (!img.classList.contains("map") || event.button !== 0) return;
  event.preventDefault();
  const figure = img.closest("figure");
  const start = pointOn(img, event);
  const move = (e) => drawMark(img, [...start, ...pointOn(img, e)]);
  const up = (e) => {
    window.removeEventListener("mousemove", move);
    window.removeEventListener("mouseup", up);
    const end = pointOn(img, e);
    const dragged = Math.abs(end[0] - start[0]) * img.clientWidth > 4 || Math.abs(end[1] - start[1]) * img.clientHeight > 4;
    const where = dragged ? { box: [...start, ...end].map((v) => v.toFixed(4)).join(",") }
      : { x: start[0].toFixed(4), y: start[1].toFixed(4) };
    showConcepts(where, +figure.dataset.class, figure.dataset.checkpoint, img);
  };
  window.addEventListener("mousemove", move);
  window.addEventListener("mouseup", up);
}

// reference patches of a channel from the run's camkit concepts results
function references(found) {
  if (!found) return [];
  return [["relevance", "most relevant in the run"], ["activation", "most active in the run"]]
    .filter(([mode]) => found[mode] && found[mode].length)
    .map(([mode, title]) => element("div", { class: `refs ${mode}` }, [
      element("span", { class: "row-label", text: title }),
      ...found[mode].map((ref) => element("img", {
        src: api(`run/${encodeURI(ref.patch)}`), alt: `${mode} reference ${ref.rank}`,
        title: `${stem(ref.image)} · ${ref.label} · score ${(+ref.score).toFixed(3)}`,
      })),
    ]));
}

// a channel's feature visualisation, computed by the server on demand (seeded, cached)
async function featureOf(card, params, channel) {
  const button = card.querySelector("button.feature");
  button.disabled = true;
  button.textContent = "computing...";
  try {
    const wanted = { layer: params.layer, channel };
    if (params.checkpoint) wanted.checkpoint = params.checkpoint;
    const { url, headers } = await fetchImage("feature", wanted);
    button.replaceWith(element("img", { class: "feature", src: url, alt: `feature visualisation of channel ${channel}` }),
      element("div", { class: "caption", text: `computed: ${headers.get("X-Camkit-Computed") || "feature visualisation"}` }));
  } catch (error) { button.disabled = false; button.textContent = "feature visualisation"; failed(error); }
}

async function conceptCard(concept, params, signal) {
  const { image, layer, x, y, box } = params;  // the heatmap of the channel's relevance where asked
  const heatParams = { image, class: params.class, layer, channel: concept.channel, alpha: $("alpha").value,
    ...(box ? { box } : x !== undefined ? { x, y } : {}) };
  if (params.checkpoint) heatParams.checkpoint = params.checkpoint;
  const card = element("div", { class: "concept", "data-channel": concept.channel }, [
    element("h4", { text: `channel ${concept.channel}` }),
    element("div", { class: "caption", text: `share ${percent(concept.share)} · relevance ${concept.relevance.toPrecision(3)}` }),
    ...pendingImage({ class: "heat", alt: `conditional heatmap of channel ${concept.channel}` }),
    element("div", { class: "caption", text: `where channel ${concept.channel} speaks for ${classText(params.class)} (red) or against it (blue)` +
      `${box ? " in the box" : x !== undefined ? " in the cell clicked" : ""}; colours clipped at the 99.5th percentile of |relevance|` }),
    ...references(concept.references),
    ...(concept.no_references ? [element("div", { class: "caption no-refs", text: concept.no_references })] : []),
    element("button", { type: "button", class: "feature", text: "feature visualisation" }),
  ]);
  card.querySelector("button.feature").addEventListener("click", () => featureOf(card, params, concept.channel));
  // the list shows first; each heatmap when computed
  fill(card.querySelector("img.heat"), getImage("concept-map", heatParams, signal)).catch(failed);
  return card;
}

async function showConcepts(where, cls, checkpoint, img) {
  const signal = latest("concepts");
  showError("");
  const box = $("concepts");
  const params = { image: state.image, class: cls, layer: $("layer").value, k: $("concept-k").value, ...where };
  if (comparing()) params.checkpoint = checkpoint;
  box.replaceChildren(element("span", { text: "finding the concepts..." }));
  try {
    const answer = await getJSON("concepts", params, signal);
    const region = answer.region;
    if (img && region.box) {
      const [h, w] = answer.size, [top, left, bottom, right] = region.box;
      drawMark(img, [left / w, top / h, right / w, bottom / h]);
    } else for (const old of document.querySelectorAll("#maps .mark")) old.remove();
    const cards = await Promise.all(answer.concepts.map((concept) => conceptCard(concept, params, signal)));
    const where = region.kind === "image" ? "in the whole image" : region.kind === "cell" ? "in the layer cell clicked" : "in the box";
    const notes = [element("p", { class: "note", text: `the ${cards.length} channels of ${answer.layer} most relevant for ${classText(cls)} ${where}; share: of the absolute relevance of all its channels there` })];
    if (!answer.references) {
      notes.push(element("p", { class: "note", text: state.info.concepts
        ? `reference images are for layer ${state.info.concepts}: choose it to see them`
        : "no reference images: run camkit concepts on this run (camkit concepts IMAGES --layer L --out RUN)" }));
    }
    box.replaceChildren(...notes, ...cards);
  } catch (error) { if (!stale(error)) { box.replaceChildren(); showError(error.message); } }
}

// ------------------------------------------------------------------ prompts (vision-language models)
// A dual encoder (CLIP, SigLIP): type a prompt, see its map. A generative model (LLaVA...): ask
// it, click a generated word: its map, and the tokens before it coloured by their relevance to
// it (the server's colours: camkit.viz.text.token_colours, the CLI's token page's).

function setupPrompts() {
  const prompts = state.info.prompts;
  if (!prompts) return;
  $("prompts").hidden = false;
  $("prompt").maxLength = prompts.max_prompt;
  $("prompt-note").textContent = prompts.kind === "dual"
    ? `Type a prompt: where the model finds it in the image (${prompts.method}, its similarity to the image).`
    : `Ask the model about the image: it answers; click a word of the answer for its map (${prompts.method}) ` +
      "and the relevance of the tokens before it (red: for the word, blue: against it).";
  $("prompt-form").addEventListener("submit", (event) => { event.preventDefault(); askPrompt().catch(promptFailed); });
  window.addEventListener("hashchange", clearPrompt);
  for (const id of ["alpha", "colormap"]) {  // the same map, drawn again (cached by the server)
    $(id).addEventListener("change", () => {
      const shown = state.promptShown;
      if (shown && !$("prompt-map").hidden) showPromptMap(shown.path, shown.params, latest("prompt")).catch(promptFailed);
    });
  }
}

function promptFailed(error) { if (!stale(error)) $("prompt-message").textContent = error.message; }

function clearPrompt() {
  forget("prompt");
  $("answer").replaceChildren();
  $("answer-context").replaceChildren();
  const img = $("prompt-map");
  img.hidden = true;
  delete img.dataset.shown;
  $("prompt-message").textContent = "";
}

async function showPromptMap(path, params, signal) {
  const img = $("prompt-map");
  delete img.dataset.shown;
  state.promptShown = { path, params };
  const shown = { ...params, alpha: $("alpha").value, colormap: $("colormap").value };
  img.src = await getImage(path, shown, signal);
  img.dataset.request = api(path, shown);
  img.hidden = false;
  img.dataset.shown = "1";
}

async function askPrompt() {
  const text = $("prompt").value.trim();
  clearPrompt();
  if (!text || state.image === null) return;
  const signal = latest("prompt");
  const asked = { image: state.image, prompt: text };
  if (state.info.prompts.kind === "dual") return showPromptMap("prompt-map", asked, signal);
  const answer = await getJSON("answer", asked, signal);
  $("answer").replaceChildren(...answer.positions.map((position, k) => {
    const word = element("button", { type: "button", class: "word", text: answer.tokens[position] });
    word.addEventListener("click", () => pickWord(answer, asked, k).catch(promptFailed));
    return word;
  }));
}

async function pickWord(answer, asked, k) {
  const signal = latest("prompt");
  $("prompt-message").textContent = "";
  for (const [i, word] of [...$("answer").children].entries()) word.classList.toggle("picked", i === k);
  $("answer-context").replaceChildren(...answer.tokens.slice(0, answer.positions[k]).map((token, i) => {
    const span = element("span", { class: "t", text: token, title: answer.relevance[k][i].toPrecision(4) });
    span.style.background = answer.colours[k][i];  // CSSOM, which the page's CSP allows
    return span;
  }));
  await showPromptMap("token-map", { ...asked, word: k }, signal);
}

// ------------------------------------------------------------------ set-up

async function route() {
  const match = /^#image=(\d+)(?:&class=(\d+))?(?:&method=([\w+-]+))?$/.exec(location.hash);
  const strategies = location.hash === "#strategies";
  $("gallery-view").hidden = !!match || strategies;
  $("image-view").hidden = !match;
  $("strategies-view").hidden = !strategies;
  for (const url of state.urls.splice(0)) URL.revokeObjectURL(url);
  for (const view of requests.keys()) forget(view);  // what the view left asked is not shown
  try {
    if (match) await openImage(+match[1], { class: match[2] && +match[2], method: match[3] });
    else if (strategies) await loadStrategies();
    else await loadGallery();
  } catch (error) { failed(error); }
}

// ------------------------------------------------------------------ strategies

function figureNumber(value, digits = 2) {
  return value === null || value === undefined ? "–" : (+value).toFixed(digits);
}

async function loadStrategies() {
  const data = await getJSON("strategies", {}, latest("strategies"));
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
        element("div", { class: "members typical", title: "typical members" }, [
          element("span", { class: "row-label", text: "typical (closest to the cluster's centre)" }), ...cluster.typical.map(link)]),
        cluster.atypical.length ? element("div", { class: "members atypical", title: "atypical members" }, [
          element("span", { class: "row-label", text: "atypical (farthest from it)" }), ...cluster.atypical.map(link)]) : "",
        clusterConceptsButton(group, cluster),
      ]))),
    ]);
  });
  const skipped = data.skipped.length ? [element("p", { class: "note", text: `${data.skipped.length} class(es) skipped: too few maps` })] : [];
  $("strategies").replaceChildren(...groups, ...skipped);
}

// the concepts that dominate a cluster, computed by the server when asked: at the layer the
// run explained, and at the layer of the run's reference patches when that is another
function clusterConceptsButton(group, cluster) {
  const holder = element("div", { class: "cluster-concepts" });
  const button = (text, layer) => {
    const node = element("button", { type: "button", text });
    node.addEventListener("click", () => show(layer));
    return node;
  };
  async function show(layer) {
    const signal = latest(`cluster ${group.method} ${group.class} ${cluster.id}`);
    holder.replaceChildren(element("span", { text: "finding the concepts..." }));
    try {
      const params = { method: group.method, class: group.class, cluster: cluster.id, ...(layer ? { layer } : {}) };
      const found = await getJSON("cluster-concepts", params, signal);
      const patches = state.info.concepts;
      const elsewhere = patches && patches !== found.layer ? [
        element("p", { class: "note hint", text: `reference patches exist for layer ${patches} (camkit concepts), not for ${found.layer}` }),
        button(`concepts of this cluster at ${patches}`, patches)] : [];
      holder.replaceChildren(
        element("span", { class: "row-label", text: `channels of ${found.layer} that dominate its ${found.images} images (mean share)` }),
        ...found.concepts.map((c) => element("div", { class: "dominant", "data-channel": c.channel }, [
          element("div", { text: `channel ${c.channel}: ${percent(c.share)}` }), ...references(c.references),
          ...(c.no_references ? [element("div", { class: "no-refs", text: c.no_references })] : [])])),
        ...elsewhere);
    } catch (error) {
      if (!stale(error)) { holder.replaceChildren(button("concepts of this cluster")); showError(error.message); }
    }
  }
  holder.append(button("concepts of this cluster"));
  return holder;
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
  if (info.run_problems.length) {  // broken files of the run: said for as long as the page is open
    $("message").before(element("div", { id: "run-problems", role: "alert", text: info.run_problems.join("\n") }));
  }
  $("model").textContent = `${info.model} · ${info.images} images` +
    (comparing() ? ` · checkpoints ${info.checkpoints.map(nameOf).join(" and ")}` : "");
  for (const form of ["filters", "controls", "concept-controls"]) $(form).addEventListener("submit", (event) => event.preventDefault());
  $("labels").replaceChildren(...info.labels.map((label, i) => element("option", { value: `${label} (${i})` })));
  if (info.truths.length) {
    $("f-truth-box").hidden = false;
    $("f-truth").append(...info.truths.map((t) => element("option", { value: t, text: t })));
  } else {  // misclassified needs a true class to compare with
    $("f-wrong").disabled = true;
    $("f-wrong-box").classList.add("off");
    $("f-wrong-box").title = "no true classes in this gallery, so nothing to call misclassified: " +
      "images in folders root/<class>/<image> give them";
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
  $("composite").append(...info.composites.map((c) => element("option", { value: c, text: c })));
  $("composite").value = info.composite;
  $("compare-box").hidden = !comparing();
  $("f-checkpoint-box").hidden = $("f-changed-box").hidden = !comparing();
  for (const option of document.querySelectorAll(".compare-only")) option.hidden = !comparing();
  $("f-checkpoint").append(...info.checkpoints.map((c) => element("option", { value: c, text: nameOf(c) })));
  $("strategies-link").hidden = !info.strategies;

  for (const id of ["f-order", "f-truth", "f-wrong", "f-predicted", "f-checkpoint", "f-changed"]) {
    $(id).addEventListener("change", () => { state.offset = 0; loadGallery().catch(failed); });
  }
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); loadGallery().catch(failed); });
  $("next").addEventListener("click", () => { state.offset += PAGE; loadGallery().catch(failed); });
  for (const id of ["class", "class2", "method", "layer", "composite", "alpha", "colormap", "compare"]) {
    $(id).addEventListener("change", updateMaps);
  }
  $("back").addEventListener("click", () => { location.hash = ""; });
  $("depth-button").addEventListener("click", depthStrip);
  $("maps").addEventListener("mousedown", startRegion);
  $("concept-image").addEventListener("click", () => showConcepts({}, state.cls, state.info.checkpoints[0], null));
  $("curve-button").addEventListener("click", curves);
  $("clip-play").addEventListener("click", playClip);
  $("cancel").addEventListener("click", cancelMaps);
  $("file").addEventListener("change", () => { if ($("file").files[0]) upload($("file").files[0]); });
  const drop = $("drop");
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault(); drop.classList.remove("over");
    if (event.dataTransfer.files[0]) upload(event.dataTransfer.files[0]);
  });
  setupPrompts();
  window.addEventListener("hashchange", route);
  await route();
  document.body.dataset.ready = "1";
}

start();
