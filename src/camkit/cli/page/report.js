"use strict";
const DATA = JSON.parse(document.getElementById("camkit-data").textContent);
const IMAGES = DATA.images;
IMAGES.forEach((image, i) => {
  image.i = i;
  image.pred = image.top5.length ? image.top5[0][1] : null;
  image.conf = image.top5.length ? image.top5[0][2] : null;
});
const CHUNK = 60;
const $ = (id) => document.getElementById(id);
const state = { sort: "conf-desc", cls: "", method: "", query: "", shown: [], rendered: 0 };

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const SVG_NS = document.documentElement.namespaceURI.replace("1999/xhtml", "2000/svg"); // no URL literal
const pct = (p) => (typeof p === "number" ? (100 * p).toFixed(1) + "%" : "?");
const num = (v) => (typeof v === "number" ? (Math.abs(v) >= 1000 || (v !== 0 && Math.abs(v) < 0.001)
  ? v.toExponential(3) : +v.toFixed(4)) : String(v));

function metricValue(image, name) {
  const values = [];
  if (image.metrics && typeof image.metrics[name] === "number") values.push(image.metrics[name]);
  for (const o of visibleOverlays(image))
    if (o.metrics && typeof o.metrics[name] === "number") values.push(o.metrics[name]);
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}
function visibleOverlays(image) {
  return state.method ? image.overlays.filter((o) => o.method === state.method) : image.overlays;
}

function setupControls() {
  const sort = $("sort");
  const options = [["conf-desc", "confidence, high first"], ["conf-asc", "confidence, low first"],
    ["name", "file name"], ["input", "input order"]];
  for (const name of DATA.metricNames)
    options.push(["m-desc:" + name, name + ", high first"], ["m-asc:" + name, name + ", low first"]);
  for (const [value, text] of options) sort.append(el("option", { value }, text));
  const counts = new Map();
  let errors = 0;
  for (const image of IMAGES) {
    if (image.error) errors++;
    else counts.set(image.pred, (counts.get(image.pred) || 0) + 1);
  }
  const cls = $("cls");
  cls.append(el("option", { value: "" }, `all classes (${counts.size})`));
  for (const [label, count] of [...counts].sort((a, b) => b[1] - a[1] || String(a[0]).localeCompare(String(b[0]))))
    cls.append(el("option", { value: "c:" + label }, `${label} (${count})`));
  if (errors) cls.append(el("option", { value: "error" }, `unreadable (${errors})`));
  const method = $("method");
  method.append(el("option", { value: "" }, "all methods"));
  for (const name of DATA.methods) method.append(el("option", { value: name }, name));
  for (const id of ["sort", "cls", "method"])
    $(id).addEventListener("change", (event) => { state[id] = event.target.value; refresh(); });
  $("query").addEventListener("input", (event) => { state.query = event.target.value.toLowerCase(); refresh(); });
  const models = [...new Set(IMAGES.map((image) => image.model).filter(Boolean))];
  $("summary").textContent = `${IMAGES.length} images · ${DATA.methods.join(", ") || "no overlays"}` +
    (models.length ? ` · model ${models.join(", ")}` : "") + ` · camkit ${DATA.camkit} · ${DATA.generated}`;
}

function refresh() {
  let shown = IMAGES.filter((image) => {
    if (state.cls === "error") { if (!image.error) return false; }
    else if (state.cls && (image.error || "c:" + image.pred !== state.cls)) return false;
    if (state.method && !image.error && !image.overlays.some((o) => o.method === state.method)) return false;
    if (state.method && image.error && state.cls !== "error") return false;
    if (state.query && !image.path.toLowerCase().includes(state.query)) return false;
    return true;
  });
  const key = state.sort;
  const last = (v, desc) => (v === null || v === undefined ? -Infinity : desc ? v : -v);
  if (key === "conf-desc" || key === "conf-asc") {
    const desc = key === "conf-desc";
    shown.sort((a, b) => last(b.conf, desc) - last(a.conf, desc) || a.i - b.i);
  } else if (key === "name") {
    shown.sort((a, b) => a.name.localeCompare(b.name) || a.i - b.i);
  } else if (key.startsWith("m-")) {
    const desc = key.startsWith("m-desc:");
    const name = key.slice(key.indexOf(":") + 1);
    const values = new Map(shown.map((image) => [image, metricValue(image, name)]));
    shown.sort((a, b) => last(values.get(b), desc) - last(values.get(a), desc) || a.i - b.i);
  } else shown.sort((a, b) => a.i - b.i);
  state.shown = shown;
  state.rendered = 0;
  $("gallery").replaceChildren();
  $("count").textContent = `showing ${shown.length} of ${IMAGES.length}`;
  if (!shown.length) $("gallery").append(el("div", { class: "empty" }, "no image matches"));
  renderMore();
}

function thumbFigure(src, caption, alt) {
  return el("figure", {},
    src ? el("img", { src, alt, loading: "lazy", decoding: "async" }) : el("div", { class: "ph" }),
    el("figcaption", {}, caption));
}

function card(image) {
  const head = el("div", { class: "card-head" }, el("span", { class: "name" }, image.name));
  const strip = el("div", { class: "strip" });
  if (image.error) {
    head.append(el("span", { class: "error" }, "unreadable: " + image.error));
  } else {
    head.append(el("span", { class: "pred" }, "predicted ", el("b", {}, image.pred ?? "?"), " ", pct(image.conf)));
    head.append(el("span", { class: "top5" }, image.top5.slice(1).map((t) => `${t[1]} ${pct(t[2])}`).join(" · ")));
    strip.append(thumbFigure(image.thumb, image.size ? `original ${image.size[0]}×${image.size[1]}` : "original", image.name));
    for (const o of visibleOverlays(image)) {
      const caption = [el("b", {}, o.method), ` → ${o.label} (${o.target}) ${pct(o.p)}`];
      if (o.metrics) caption.push(el("br"), el("span", { class: "metric" },
        Object.entries(o.metrics).map(([k, v]) => `${k} ${num(v)}`).join(" · ")));
      strip.append(thumbFigure(o.thumb, caption, `${o.method} overlay of ${image.name}`));
    }
  }
  if (image.metrics) head.append(el("span", { class: "metric" },
    Object.entries(image.metrics).map(([k, v]) => `${k} ${num(v)}`).join(" · ")));
  return el("article", { class: "card", "data-index": image.i, tabindex: 0, role: "button",
    onclick: () => openDetail(image.i),
    onkeydown: (event) => { if (event.key === "Enter") openDetail(image.i); } }, head, strip);
}

function renderMore() {
  const end = Math.min(state.shown.length, state.rendered + CHUNK);
  const fragment = document.createDocumentFragment();
  for (let k = state.rendered; k < end; k++) fragment.append(card(state.shown[k]));
  $("gallery").append(fragment);
  state.rendered = end;
}

new IntersectionObserver((entries) => {
  if (entries.some((entry) => entry.isIntersecting) && state.rendered < state.shown.length) renderMore();
}, { rootMargin: "1200px" }).observe($("more"));

function colorbar(gradient, low, high, label) {
  return el("div", {}, el("div", { class: "colorbar", style: "background: " + gradient }),
    el("div", { class: "scale" }, el("span", {}, num(low)), el("span", {}, label), el("span", {}, num(high))));
}

function table(rows, head) {
  return el("table", {}, head ? el("tr", {}, head.map((h) => el("th", {}, h))) : null,
    rows.map((cells) => el("tr", {}, cells.map((c) => (c instanceof Node ? el("td", {}, c)
      : el("td", { class: typeof c === "number" ? "num" : null }, typeof c === "number" ? num(c) : c))))));
}

function openDetail(i) {
  const image = IMAGES[i];
  if (!image) return;
  const panel = el("div", { class: "panel" });
  const position = state.shown.indexOf(image);
  const step = (d) => { const next = state.shown[position + d]; if (next) openDetail(next.i); };
  panel.append(el("div", { class: "bar" }, el("h2", {}, image.path),
    el("button", { onclick: () => step(-1), disabled: position > 0 ? null : "" }, "← previous"),
    el("button", { onclick: () => step(1), disabled: position >= 0 && position < state.shown.length - 1 ? null : "" }, "next →"),
    el("button", { id: "close", onclick: closeDetail }, "close (Esc)")));
  if (image.error) panel.append(el("p", { class: "error" }, "unreadable: " + image.error));
  const big = el("div", { class: "big" });
  const clip = image.overlays.some((o) => o.video);  // a video: its first frame, a link to it
  big.append(el("figure", {}, el("img", { src: clip && image.thumb ? image.thumb : image.src, alt: "original " + image.name,
    onerror: (event) => { if (image.thumb && event.target.src !== new URL(image.thumb, location.href).href) event.target.src = image.thumb; } }),
    el("figcaption", {}, image.size ? `original ${image.size[0]}×${image.size[1]}` : "original",
      clip ? [" · ", el("a", { href: image.src }, "video")] : "")));
  for (const o of image.overlays) {
    big.append(el("figure", {}, o.video ? clipAnimation(o) : el("img", { src: o.src, alt: `${o.method} overlay` }),
      el("figcaption", {}, el("b", {}, o.method), ` → ${o.label} (${o.target}) ${pct(o.p)}`,
        o.layer ? ` · layer ${o.layer}` : "", o.video ? [" · ", el("a", { href: o.video.mp4 }, "MP4")] : "",
        o.tokens ? el("span", {}, " · ", el("a", { href: o.tokens, class: "tokens" }, "prompt tokens' relevance")) : "")));
  }
  panel.append(big);
  const clips = image.overlays.filter((o) => o.video);
  if (clips.length) panel.append(el("h3", {}, "per-frame importance (share of the map per frame)"),
    el("div", { class: "big" }, clips.map((o) => el("figure", {}, importanceCurve(o.video.importance, o.video.fps),
      el("figcaption", {}, el("b", {}, o.method), ` ${o.video.importance.length} frames`,
        o.video.plot ? [" · ", el("a", { href: o.video.plot }, "plot (PNG)")] : "")))));
  const raws = image.overlays.filter((o) => o.raw);
  if (raws.length) {
    const rawRow = el("div", { class: "big" });
    for (const o of raws) {
      rawRow.append(el("figure", {}, el("img", { class: "raw", src: o.raw.src, alt: `${o.method} raw map` }),
        colorbar(DATA.gradients[o.raw.cmap] || DATA.gradients[DATA.colormap], o.raw.min, o.raw.max,
          o.raw.cmap === "bwr" ? "signed, 0 at centre" : "raw map"),
        el("figcaption", {}, el("b", {}, o.method), ` raw map ${o.raw.size[0]}×${o.raw.size[1]} (`,
          el("a", { href: o.raw.file }, ".npy"), ")")));
    }
    panel.append(el("h3", {}, "raw maps"), rawRow);
  }
  const facts = el("div", { class: "facts" });
  if (image.top5.length) facts.append(el("div", {}, el("h3", {}, "predicted top-5"),
    table(image.top5.map((t) => [t[1], String(t[0]), el("span", {}, el("span", { class: "pbar", style: `width:${Math.round(80 * t[2])}px` }), " " + pct(t[2]))]), ["class", "index", "probability"])));
  const targets = image.overlays.map((o) => [o.method, `${o.label} (${o.target})`, pct(o.p)]);
  if (targets.length) facts.append(el("div", {}, el("h3", {}, "targets"), table(targets, ["method", "target", "probability"])));
  const metricRows = [];
  if (image.metrics) for (const [k, v] of Object.entries(image.metrics)) metricRows.push(["image", k, v]);
  for (const o of image.overlays) if (o.metrics) for (const [k, v] of Object.entries(o.metrics)) metricRows.push([o.method, k, v]);
  if (metricRows.length) facts.append(el("div", {}, el("h3", {}, "metrics"), table(metricRows, ["map", "metric", "value"])));
  facts.append(el("div", {}, el("h3", {}, "overlay colour scale"),
    colorbar(DATA.gradients[DATA.colormap], 0, 1, DATA.colormap + ", per-image map"),
    el("p", { class: "pred" }, "CAMs are scaled to [0, 1] per image; pixel maps by their 99th percentile.")));
  const info = [];
  if (image.model) info.push(["model", image.model]);
  for (const [k, v] of Object.entries(image.info || {})) info.push([k, v]);
  for (const o of image.overlays) for (const [k, v] of Object.entries(o.info || {})) info.push([`${o.method} ${k}`, v]);
  if (info.length) facts.append(el("div", {}, el("h3", {}, "run"), table(info)));
  panel.append(facts);
  const detail = $("detail");
  detail.replaceChildren(panel);
  detail.hidden = false;
  detail.dataset.index = String(i);
  if (location.hash !== "#image=" + i) history.replaceState(null, "", "#image=" + i);
}

// ----------------------------------------------------------------------------- videos

// a video's overlay: the animated GIF (one frame per input frame); past the GIF's frame limit
// the MP4 in a <video> element (camkit writes mp4v, which not every browser decodes)
function clipAnimation(o) {
  return o.video.gif ? el("img", { class: "clip", src: o.video.gif, alt: `${o.method} animated overlay` })
    : el("video", { class: "clip", src: o.video.mp4, controls: "", loop: "", muted: "" });
}

// the per-frame importance as an inline SVG: one step per frame, the peak frame marked
function importanceCurve(values, fps) {
  const ns = SVG_NS, width = 360, height = 110, pad = 18;
  const top = Math.max(...values, 1e-12), step = (width - 2 * pad) / Math.max(values.length, 1);
  const y = (v) => height - pad - (height - 2 * pad) * v / top;
  let d = `M${pad},${height - pad}`;
  values.forEach((v, t) => { d += ` L${pad + t * step},${y(v)} L${pad + (t + 1) * step},${y(v)}`; });
  d += ` L${width - pad},${height - pad} Z`;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "curve");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.dataset.frames = String(values.length);
  const peak = values.indexOf(top);
  const parts = [["path", { d, fill: "#f4a261", stroke: "#d95f02" }],
    ["line", { x1: pad, y1: height - pad, x2: width - pad, y2: height - pad, stroke: "#667085" }],
    ["text", { x: pad, y: height - 4, "font-size": 10 }, "frame 0"],
    ["text", { x: width - pad, y: height - 4, "font-size": 10, "text-anchor": "end" },
      `${values.length - 1}` + (fps ? ` (${((values.length - 1) / fps).toFixed(1)} s)` : "")],
    ["text", { x: pad + (peak + 0.5) * step, y: 12, "font-size": 10, "text-anchor": "middle", class: "peak" },
      `peak: frame ${peak} (${pct(top)})`]];
  for (const [tag, attributes, text] of parts) {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, String(v));
    if (text) node.textContent = text;
    svg.append(node);
  }
  return svg;
}

function closeDetail() {
  $("detail").hidden = true;
  $("detail").replaceChildren();
  history.replaceState(null, "", location.pathname + location.search);
}

$("detail").addEventListener("click", (event) => { if (event.target === $("detail")) closeDetail(); });
document.addEventListener("keydown", (event) => {
  if ($("detail").hidden) return;
  if (event.key === "Escape") closeDetail();
  else if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
    const position = state.shown.indexOf(IMAGES[+$("detail").dataset.index]);
    const next = state.shown[position + (event.key === "ArrowRight" ? 1 : -1)];
    if (next) openDetail(next.i);
  }
});

// ----------------------------------------------------------------------------- strategies
const STRATEGIES = DATA.strategies;
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

function showView(name) {
  for (const id of ["gallery", "more", "gallery-controls"]) $(id).hidden = name !== "gallery";
  for (const view of ["strategies", "concepts"]) {
    $(view).hidden = name !== view;
    $(`view-${view}`).classList.toggle("on", name === view);
  }
  $("view-gallery").classList.toggle("on", name === "gallery");
}

function memberThumb(i, method) {
  const image = IMAGES[i];
  if (!image) return null;
  const o = image.overlays.find((o) => o.method === method);
  return o ? o.thumb : image.thumb;
}

function member(i, method) {
  const image = IMAGES[i];
  const src = memberThumb(i, method);
  const name = image ? image.name : "?";
  return src ? el("img", { src, alt: name, title: name, loading: "lazy", "data-index": i,
    onclick: () => openDetail(i) }) : el("span", { class: "ph" }, name);
}

function scatter(group) {
  const ns = SVG_NS;
  const width = 380, height = 300, pad = 10;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "scatter");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const xs = group.points.map((p) => p[0]), ys = group.points.map((p) => p[1]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const sx = (x) => pad + (width - 2 * pad) * (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5);
  const sy = (y) => pad + (height - 2 * pad) * (y1 > y0 ? (y1 - y) / (y1 - y0) : 0.5);
  for (const [x, y, c, i] of group.points) {
    const dot = document.createElementNS(ns, "circle");
    dot.setAttribute("cx", sx(x).toFixed(1));
    dot.setAttribute("cy", sy(y).toFixed(1));
    dot.setAttribute("r", group.points.length > 2000 ? 2 : 4);
    dot.setAttribute("fill", c < 0 ? "#999" : PALETTE[c % PALETTE.length]);
    dot.dataset.index = i;
    dot.dataset.cluster = c;
    dot.addEventListener("mouseenter", (event) => {
      const image = IMAGES[i];
      const src = memberThumb(i, group.method);
      $("hover").replaceChildren(src ? el("img", { src, alt: "" }) : "",
        el("div", {}, (image ? image.name : "?") + (c < 0 ? " · noise" : ` · cluster ${c}`)));
      $("hover").style.left = event.clientX + 14 + "px";
      $("hover").style.top = event.clientY + 14 + "px";
      $("hover").hidden = false;
    });
    dot.addEventListener("mouseleave", () => { $("hover").hidden = true; });
    dot.addEventListener("click", () => openDetail(i));
    svg.append(dot);
  }
  return svg;
}

function renderStrategy() {
  const group = STRATEGIES.groups[+$("strategy-group").value];
  const order = $("strategy-order").value;
  const clusters = [...group.clusters].sort((a, b) => order === "score"
    ? b.score - a.score || a.id - b.id : b.size - a.size || a.id - b.id);
  const top = Math.max(...group.clusters.map((c) => c.score));
  const body = el("div", {},
    el("p", { class: "pred" }, `${group.samples} maps of ${group.label} (${group.class}) by ${group.method} · `,
      el("b", {}, `eigengap suggests ${group.suggested}`), ` · ${group.k} cluster(s) · suspiciousness: `,
      "distance to the rest of the class × concentration (docs/strategies.md)"),
    el("div", { class: "strategy-top" },
      group.eigengap ? el("img", { src: group.eigengap, alt: "eigenvalue spectrum" }) : null,
      group.points.length ? scatter(group) : null),
    el("div", { class: "clusters" }, clusters.map((c) => el("div", {
      class: "cluster" + (group.clusters.length > 1 && c.score === top && top > 0 ? " flagged" : ""), "data-cluster": c.id },
      el("h3", {}, el("span", { style: `color:${PALETTE[c.id % PALETTE.length]}` }, "● "), `cluster ${c.id}`),
      c.prototype ? el("img", { class: "proto", src: c.prototype, alt: `prototype of cluster ${c.id}` }) : null,
      el("span", { class: "facts" }, `${c.size} maps · confidence ${pct(c.confidence)} · accuracy ${c.accuracy === null ? "unknown" : pct(c.accuracy)} · suspiciousness ${num(c.score)}`),
      el("h4", {}, "typical members"), el("div", { class: "members typical" }, c.typical.map((i) => member(i, group.method))),
      el("h4", {}, "atypical members"), el("div", { class: "members atypical" }, c.atypical.map((i) => member(i, group.method))),
      c.concepts ? [el("h4", {}, `dominant concepts (channels of ${c.concepts.layer})`),
        el("div", { class: "dominant" }, c.concepts.channels.map((d) => el("div", { "data-channel": d.channel },
          `channel ${d.channel}: ${pct(d.share)} of the relevance`, atlasPatches(d.channel, c.concepts.layer))))] : null))));
  $("strategy-body").replaceChildren(body);
}

// ----------------------------------------------------------------------------- concept atlas
const ATLAS = DATA.concepts;

function patch(ref, mode) {
  return el("img", { src: ref.src, alt: `${mode} reference ${ref.rank}`, loading: "lazy",
    title: `${ref.image} · ${ref.label} · score ${num(ref.score)}` });
}

// a channel's most relevant reference patches, when the atlas has the channel of that layer
function atlasPatches(channel, layer) {
  const found = ATLAS && ATLAS.layer === layer && ATLAS.channels.find((c) => c.channel === channel);
  return found ? el("div", { class: "patches" }, found.relevance.slice(0, 4).map((r) => patch(r, "relevance"))) : null;
}

function setupAtlas() {
  if (!ATLAS) return;
  $("views").hidden = false;
  $("view-concepts").hidden = false;
  $("view-concepts").addEventListener("click", () => showView("concepts"));
  $("concepts").append(
    el("p", { class: "pred" }, `Concept atlas of layer ${ATLAS.layer} (camkit concepts over ${ATLAS.images} images, `,
      `relevance by ${ATLAS.rules}): for each channel, the patches of the images in which it is most relevant `,
      "for the predicted class and those in which it is most active (Achtibat et al., 2023); scores are each ",
      "image's share of its absolute channel relevance (or activation)."),
    el("div", { class: "atlas" }, ATLAS.channels.map((c) => el("div", { class: "atlas-channel", "data-channel": c.channel },
      el("h3", {}, `channel ${c.channel}`),
      [["relevance", "most relevant"], ["activation", "most active"]].flatMap(([mode, title]) => [
        el("h4", {}, `${title} · scores ${c[mode].map((r) => num(r.score)).join(", ")}`),
        el("div", { class: `patches ${mode}` }, c[mode].map((r) => patch(r, mode)))]),
    ))));
}

function setupStrategies() {
  $("view-gallery").addEventListener("click", () => showView("gallery"));
  if (!STRATEGIES || !STRATEGIES.groups.length) return;
  $("views").hidden = false;
  $("view-strategies").hidden = false;
  $("view-strategies").addEventListener("click", () => showView("strategies"));
  const groups = el("select", { id: "strategy-group" }, STRATEGIES.groups.map((g, k) =>
    el("option", { value: k }, `${g.label} (${g.class}) · ${g.method} · ${g.samples} maps, ${g.k} cluster(s)`)));
  const order = el("select", { id: "strategy-order" }, el("option", { value: "size" }, "largest first"),
    el("option", { value: "score" }, "most suspicious first"));
  groups.addEventListener("change", renderStrategy);
  order.addEventListener("change", renderStrategy);
  const skipped = STRATEGIES.skipped.length ? el("span", { class: "pred" },
    `${STRATEGIES.skipped.length} class(es) skipped: too few maps`) : null;
  $("strategies").append(el("div", { class: "controls" }, el("label", {}, "Class ", groups),
    el("label", {}, "Clusters ", order), skipped), el("div", { id: "strategy-body" }));
  renderStrategy();
}

setupControls();
setupStrategies();
setupAtlas();
refresh();
const match = /^#image=(\d+)$/.exec(location.hash);
if (match) openDetail(+match[1]);
if (location.hash === "#strategies" && STRATEGIES) showView("strategies");
if (location.hash === "#concepts" && ATLAS) showView("concepts");
document.body.dataset.ready = "1";
