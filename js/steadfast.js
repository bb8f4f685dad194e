// ComfyUI-Steadfast frontend: show hash, match state, comparison and compile state on our nodes
// after they execute. Uses the documented extension hooks (beforeRegisterNodeDef + onExecuted).
import { app } from "../../scripts/app.js";

// The pack's nodes, learned from /object_info as the frontend registers each node type (beforeRegisterNodeDef gets
// the node's /object_info entry): every node whose category is "Steadfast" or under it, as nodes/*.py declare it.
// No hand-kept list that a new node could be missing from.
const CATEGORY = "Steadfast";
const NODES = new Set();
const isOurs = (nodeData) => nodeData?.category === CATEGORY || String(nodeData?.category ?? "").startsWith(`${CATEGORY}/`);

// Optimize Model lost its two pipeline-only widgets (vae_slicing, vae_tiling: now on Pipeline Optimize).
// widgets_values are positional, so a workflow saved with them would shift strict_recompiles and
// compile_cache by two: map such a saved list by the old widget names instead.
const OPTIMIZE_OLD_WIDGETS = [
  "qkv_fusion", "channels_last", "attention", "compile", "backend", "mode", "dynamic", "fullgraph",
  "vae_slicing", "vae_tiling", "strict_recompiles", "compile_cache",
];

// The default a fresh widget gets from its /object_info spec: "default", else a combo's first option
// (V1 [[options], {...}] or V3 ["COMBO", {options: [...]}]); scripts/api_to_ui.py widget_default, same rule.
function specDefault(spec) {
  const opts = Array.isArray(spec) && spec[1] && typeof spec[1] === "object" ? spec[1] : {};
  if (opts.default !== undefined && opts.default !== null) return opts.default;
  const choices = Array.isArray(spec?.[0]) ? spec[0] : opts.options;
  return choices?.length ? choices[0] : undefined;
}

// A pack sampler's seed is for repeating: its "control after generate" starts at "fixed" on a new node, so a workflow
// that arrives without saved control values (an API-format file dragged in, a node added from the menu) repeats the
// seed. A saved UI workflow's own value is applied after this (onConfigure) and stays. The V3 schema's
// ControlAfterGenerate.fixed would say the same, but frontend 1.49.6 takes that string as the control widget's name
// (a combo labelled "fixed"), and ComfyUI 0.8.0's schema has no such value.
const CONTROL_MODES = ["fixed", "increment", "decrement", "randomize"];
function fixSeedControl(node) {
  const seed = node.widgets?.find((w) => w.name === "seed");
  const control = node.widgets?.find((w) => w.name === "control_after_generate")
    ?? seed?.linkedWidgets?.find((w) => CONTROL_MODES.includes(w.value));
  if (control) control.value = "fixed";
}

// A saved workflow keeps the height a node's report needed, not the report (never serialized): reopened, the node
// would stand that tall and empty (Compare 828 px in issue 46). A node configured without a report shown is made no
// taller than its widgets; a report shown later (a run, a tab's outputs given back) grows it again (showText).
function shrinkEmpty(node) {
  if (node.widgets?.find((x) => x.name === INFO)?.value) return;
  const [, minH] = node.computeSize();
  if (node.size[1] > minH + 1) node.setSize([node.size[0], minH]);
}

function migrateOptimizeWidgets(node, info, nodeData) {
  const saved = info?.widgets_values;
  // today's list can have the same length (widgets added after compile_cache): the old one has vae_tiling
  // (a boolean) where today's has compile_cache (a string)
  if (!Array.isArray(saved) || saved.length !== OPTIMIZE_OLD_WIDGETS.length || typeof saved[9] !== "boolean") return;
  const specs = { ...(nodeData?.input?.required || {}), ...(nodeData?.input?.optional || {}) };
  for (const w of node.widgets || []) {
    const i = OPTIMIZE_OLD_WIDGETS.indexOf(w.name);
    if (i >= 0) w.value = saved[i];
    else if (w.name in specs && specDefault(specs[w.name]) !== undefined) w.value = specDefault(specs[w.name]);
  }
}

// Colours show the state of the LAST RUN in this session: kept on the node object (never serialized), drawn as a
// frame in onDrawForeground, so a loaded workflow or a dropped PNG shows no old green/red before anything ran.
const STATE_COLORS = { match: "#2e7d32", mismatch: "#c62828", expected: "#b7791f", same_picture: "#1565c0" };
// Graded verdicts (core/record/verdict.py): the frame colour and a label above the node say which level.
const LEVEL_TEXT = { identical: "IDENTICAL BYTES", same_picture: "SAME PICTURE (within tolerance)",
  different_picture: "DIFFERENT PICTURE", ungraded: "BYTES DIFFER (items without a thumbnail: not graded)",
  unknown: "BYTES DIFFER (no reference to grade by)" };

// The state and label of a graded verdict ({level, psnr, max_abs}): identical bytes stay green ("match"), a
// different picture red ("mismatch"), the same picture within tolerance is blue; the label names the level.
const LEVEL_STATE = { identical: "match", same_picture: "same_picture", different_picture: "mismatch",
  ungraded: "mismatch", unknown: "mismatch" };
function verdictState(v, fallback) {
  if (!v?.level) return { state: fallback, label: null };
  let label = LEVEL_TEXT[v.level] ?? v.level;
  if (v.level !== "identical" && v.level !== "ungraded" && v.psnr !== null && v.psnr !== undefined) {
    const psnr = typeof v.psnr === "number" ? v.psnr.toFixed(1) : v.psnr;
    label += ` PSNR ${psnr} dB`;
  }
  return { state: LEVEL_STATE[v.level] ?? fallback, label };
}
const MAX_BOX_PX = 2400; // a longer report scrolls inside its box
const GAP_PX = 20; // room left between a grown node and the nodes it pushes down

// A Nodes 2.0 (Vue renderer) node's element, where the page has one (an element with data-node-id); else null.
const vueNodeElement = (node) => (typeof document === "undefined" ? null
  : document.querySelector(`.lg-node[data-node-id="${String(node.id).replace(/["\\]/g, "")}"]`));
const inVueNode = (el) => !!el?.closest?.("[data-node-id]");

// The width the report box has once the frontend has laid it out, or null while it has not (Nodes 2.0 only).
// - Classic canvas: the node's width (the widget's own width where it has one) less the widget's margin on each
//   side: the frontend's DOM-widget layer gives the box that width, in canvas units (DomWidgets.vue /
//   domWidget.ts: `(widget.width ?? node.width) - margin * 2`, from 1.35 to 1.58 at least). The element's own
//   offsetWidth is NOT used there: the frontend asks for the minimum height (getMinHeight) while the freshly
//   mounted <textarea> is still a few px wide (its parent 0 px, frontends 1.53-1.58), and a text measured at
//   that width wraps one character per line (a 100-character report measured 1,261 px tall).
// - Nodes 2.0: the box's own width, once it is laid out (at least MIN_LAID_OUT_PX: a just-mounted box is its padding
//   and border, a few px; a laid-out one can be far narrower than the node, beside its label, frontend 1.35.9).
const MIN_LAID_OUT_PX = 40;
function boxWidth(el, node, w) {
  if (!inVueNode(el)) return Math.max(60, (w?.width ?? node.size[0]) - 2 * (w?.margin ?? 10));
  return el.offsetWidth >= MIN_LAID_OUT_PX ? el.offsetWidth : null;
}

// Height the report box needs for its text at ``width`` px, measured in the DOM: a hidden twin of the box (same
// class, font, padding, border and width) holds the text and reports its scrollHeight, so the text is never cut,
// whatever font the theme uses and however lines wrap.
let measurer = null;
function textHeight(el, width) {
  if (!measurer) {
    measurer = document.createElement("textarea");
    measurer.setAttribute("aria-hidden", "true");
    measurer.tabIndex = -1;
    Object.assign(measurer.style, { position: "absolute", left: "-10000px", top: "0", visibility: "hidden",
                                    overflow: "hidden", height: "0px", minHeight: "0px", resize: "none" });
    document.body.appendChild(measurer);
  }
  measurer.className = el.className;
  const cs = getComputedStyle(el);
  for (const p of ["fontFamily", "fontSize", "fontWeight", "lineHeight", "letterSpacing", "whiteSpace", "wordBreak",
                   "overflowWrap", "tabSize", "paddingTop", "paddingBottom", "paddingLeft", "paddingRight",
                   "borderTopWidth", "borderBottomWidth", "borderLeftWidth", "borderRightWidth", "borderStyle",
                   "boxSizing"]) measurer.style[p] = cs[p] || el.style[p];
  measurer.style.width = `${width}px`;
  measurer.value = el.value || " ";
  const border = measurer.offsetHeight - measurer.clientHeight; // 0 px tall: only the borders remain
  return Math.min(MAX_BOX_PX, Math.ceil(measurer.scrollHeight + border) + 2);
}

// A node's box in canvas units, title bar included: {x, y, w, h}. On the canvas: pos and size, the title bar above
// pos. In Nodes 2.0 the node's element can be taller than size + title (a badge row and an error footer: 52-82 px on
// frontend 1.58.1), so the box is as wide and tall as the element too: its own size (offsetWidth/offsetHeight, in
// canvas units: the transform that pans and zooms the nodes' layer does not change it), its top-left corner at pos
// less the title bar (where the renderer places it, LGraphNode.vue in 1.35.9 to 1.58.1). Never the element's
// rectangle on the page: the layer follows the canvas a frame later, so right after a pan or zoom that rectangle is
// where the node was (1.35.9: a report shown then pushed nodes that it did not cover). The element is what the user
// sees, and the size is what the classic canvas draws when switched back (saved with the workflow); while zoomed out
// far the renderer draws simplified, shorter elements: the size still counts.
function nodeBox(n) {
  const th = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
  const box = { x: n.pos[0], y: n.pos[1] - th, w: n.size[0], h: n.size[1] + th };
  const el = vueNodeElement(n);
  if (el && el.offsetHeight > 0) {
    box.w = Math.max(box.w, el.offsetWidth);
    box.h = Math.max(box.h, el.offsetHeight);
  }
  return box;
}

// Move ``node`` to (x, y) in canvas units, in both renderers: through node.setPos where the node has it (1.49 on;
// the frontend's own align and distribute commands call it from 1.53), else through the canvas's
// repositionNodesVueMode (1.35.9: setting node.pos there moves the graph's node but not the layout store that Nodes
// 2.0 draws the element from; the frontend's align and distribute commands move nodes through it, in both
// renderers), else by setting node.pos.
function moveNode(node, x, y) {
  if (typeof node.setPos === "function") return node.setPos(x, y);
  const canvas = app.canvas;
  if (typeof canvas?.repositionNodesVueMode === "function") {
    return canvas.repositionNodesVueMode([{ node, newPos: { x, y } }]);
  }
  node.pos = [x, y];
}

// The nodes of ``node``'s graph, or null when that graph no longer holds ``node``.
function graphNodes(node) {
  const graph = node?.graph;
  const nodes = graph ? graph.nodes ?? graph._nodes ?? [] : [];
  return nodes.includes(node) ? nodes : null;
}

// Nodes the grown ``node`` now overlaps, and below them in turn, move down to make room (the layout keeps its
// columns; a node above or beside the grown one never moves). Boxes are read once, before anything moves (a Nodes
// 2.0 element takes its new place only in a later frame), and a moved node's box moves with it.
// A node whose graph no longer holds it (another workflow was loaded before a deferred fit ran: the graph clears
// its list but leaves the removed node's graph set) is left alone.
function makeRoom(node) {
  const nodes = graphNodes(node);
  if (!nodes) return;
  const boxes = new Map(nodes.map((n) => [n, nodeBox(n)]));
  const queue = [node];
  const moved = new Set([node]);
  while (queue.length) {
    const a = boxes.get(queue.shift());
    const bottom = a.y + a.h;
    for (const b of nodes) {
      const bb = boxes.get(b);
      if (moved.has(b) || bb.y < a.y) continue;
      const across = bb.x < a.x + a.w && a.x < bb.x + bb.w;
      if (across && bb.y < bottom + GAP_PX / 2) {
        const dy = bottom + GAP_PX - bb.y;
        moveNode(b, b.pos[0], b.pos[1] + dy);
        bb.y += dy;
        moved.add(b);
        queue.push(b);
      }
    }
  }
}

const INFO = "steadfast_info";

// A read-only, multi-line text box (DOM widget, public node.addDOMWidget API): the whole hash / report stays
// readable and selectable. Falls back to a single-line canvas text widget on frontends without DOM widgets.
function addInfoWidget(node) {
  if (typeof node.addDOMWidget === "function") {
    const el = document.createElement("textarea");
    el.readOnly = true;
    el.spellcheck = false;
    el.className = "comfy-multiline-input steadfast-info";
    Object.assign(el.style, { fontFamily: "monospace", fontSize: "11px", opacity: 0.9, resize: "none" });
    // the frontend sizes the box to the widget's height less its margin above and below
    let w = null;
    w = node.addDOMWidget(INFO, "steadfast_info", el, {
      getValue: () => el.value,
      setValue: (v) => { el.value = v ?? ""; },
      serialize: false,
      getMinHeight: () => textHeight(el, boxWidth(el, node, w) ?? Math.max(60, node.size[0] - 20))
        + 2 * (w?.margin ?? 10),
    });
    w.serialize = false; // never saved into widgets_values: saved workflows stay loadable
    return w;
  }
  const w = node.addWidget("text", INFO, "", () => {}, { serialize: false });
  w.serialize = false;
  return w;
}

// The Vue ("Nodes 2.0") renderer lays DOM widgets out itself (inside an element with data-node-id) and ignores
// getMinHeight: there the box is given the height of its text, measured on the hidden twin (textHeight), never on
// the box itself. The height depends only on the text and the box's width, so it is set again only when one of
// them changes: a box that grows makes no new measurement (a box's own scrollHeight is at least its height, so
// fitting to it grew the box a little on every resize, without end), and a shorter text gives a shorter box.
// The canvas renderer is left to getMinHeight and the node size set in showText.
function fitVueBox(el, node, w) {
  const fit = () => {
    if (!el.isConnected || !inVueNode(el)) return;
    const width = boxWidth(el, node, w);
    if (width === null) return; // not laid out yet: the observer calls again when the box gets its width
    const key = `${width}\n${el.value}`;
    if (el.steadfastFitted === key) return; // same text, same width: the height it has is right
    el.steadfastFitted = key;
    const h = `${textHeight(el, width)}px`;
    Object.assign(el.style, { height: h, minHeight: h, maxHeight: h });
    // the node takes its new height once the frontend has laid it out: then the nodes below make room
    requestAnimationFrame(() => setTimeout(() => { makeRoom(node); node.setDirtyCanvas?.(true, true); }, 50));
  };
  if (!el.steadfastObserver && typeof ResizeObserver === "function") {
    el.steadfastObserver = new ResizeObserver(() => fit()); // a new width wraps the text anew
    el.steadfastObserver.observe(el);
  }
  requestAnimationFrame(fit);
}

// The report box is as tall as its text (up to MAX_BOX_PX, then it scrolls), so no line is cut off: on the canvas
// the node takes the height its widgets need (node.computeSize, which asks getMinHeight), so a node grows with a
// longer report and shrinks back with a shorter one; the nodes below make room, so the node covers none of them.
// In Nodes 2.0 the node's element is sized by its content (fitVueBox): there the size only ever grows here.
function fitNode(node) {
  if (!graphNodes(node)) return; // fitted a frame later: the workflow may have been replaced meanwhile
  const [minW, minH] = node.computeSize();
  const vue = !!window.LiteGraph?.vueNodesMode || !!vueNodeElement(node);
  const size = [Math.max(node.size[0], minW), vue ? Math.max(node.size[1], minH) : minH];
  if (Math.abs(size[0] - node.size[0]) > 1 || Math.abs(size[1] - node.size[1]) > 1) node.setSize(size);
  makeRoom(node);
  node.setDirtyCanvas(true, true);
}
// Frontend 1.35.9's Nodes 2.0 keeps a node's list of widgets as it was when any widget's callback last ran (a seed's
// control after queueing, an edit): a widget added after that is never drawn (its element never enters the page).
// Where the node has an element but the box is still not in the page a frame later, the renderer is made to take
// the node's widgets again through the hook by which it takes them after a workflow loads
// (node.onAfterGraphConfigured, which it wraps on each node it draws; the frontend calls it on every node after
// each load, so calling it again is what a load does).
function mountInVue(node, el) {
  requestAnimationFrame(() => setTimeout(() => {
    if (el.isConnected || !vueNodeElement(node) || typeof node.onAfterGraphConfigured !== "function") return;
    node.onAfterGraphConfigured();
    requestAnimationFrame(() => { if (el.isConnected) fitVueBox(el, node, node.widgets?.find((x) => x.element === el)); });
  }, 50));
}
function showText(node, text) {
  const w = node.widgets?.find((x) => x.name === INFO) ?? addInfoWidget(node);
  w.value = text;
  if (w.element) mountInVue(node, w.element);
  if (w.element) fitVueBox(w.element, node, w);
  fitNode(node);
  // once the frontend has laid the box out (a new box is mounted in a later frame), fit again
  requestAnimationFrame(() => fitNode(node));
}

// Compare's run-record differences, raw ("field: a -> b", from its verdict's env_diffs), in Nodes 2.0: a closed
// <details> element below the report, opened with a click (the report's own line names how many fields differ and
// which). On the canvas that line is all, with "see the two run records": the widget is added only while Nodes 2.0
// draws the node and removed when a later report is shown on the canvas or has no differences.
const DIFFS = "steadfast_record_diffs";
function showRecordDiffs(node, diffs) {
  let w = node.widgets?.find((x) => x.name === DIFFS);
  const vue = !!window.LiteGraph?.vueNodesMode || !!vueNodeElement(node);
  if (!vue || !diffs?.length || typeof node.addDOMWidget !== "function") {
    if (w && typeof node.removeWidget === "function") node.removeWidget(w);
    return;
  }
  if (!w) {
    const el = document.createElement("details");
    el.className = "steadfast-record-diffs";
    Object.assign(el.style, { fontFamily: "monospace", fontSize: "11px", opacity: 0.9 });
    const summary = document.createElement("summary");
    summary.style.cursor = "pointer";
    const pre = document.createElement("pre");
    Object.assign(pre.style, { margin: "4px 0 0", whiteSpace: "pre-wrap", overflowWrap: "anywhere",
                               maxHeight: "320px", overflow: "auto" });
    el.append(summary, pre);
    // opened or closed, the node's element changes height: the nodes below make room once it is laid out
    el.addEventListener("toggle", () => requestAnimationFrame(() => setTimeout(() => {
      makeRoom(node);
      node.setDirtyCanvas?.(true, true);
    }, 50)));
    w = node.addDOMWidget(DIFFS, DIFFS, el, { serialize: false, getValue: () => "", setValue: () => {},
                                               getMinHeight: () => el.offsetHeight || 24 });
    w.serialize = false;
  }
  const [summary, pre] = w.element.children;
  summary.textContent = `raw run-record differences (${diffs.length} field${diffs.length === 1 ? "" : "s"})`;
  pre.textContent = diffs.join("\n");
}

// Width of the badges the frontend draws above a node's title bar (LGraphBadge.getWidth where the frontend has
// it), else of a "Steadfast" badge in its font, with its padding.
function badgesWidth(node, ctx) {
  let width = 0;
  for (const b of node.badges ?? []) {
    const badge = typeof b === "function" ? b() : b;
    width += (typeof badge?.getWidth === "function" ? badge.getWidth(ctx) : 0) + 4;
  }
  if (width > 0) return width;
  ctx.save();
  ctx.font = "12px sans-serif";
  width = ctx.measureText("Steadfast").width + 20;
  ctx.restore();
  return width;
}

// ``text`` split at spaces into lines no wider than ``maxWidth`` (a longer word keeps a line of its own).
function wrapLabel(ctx, text, maxWidth) {
  const lines = [];
  let line = "";
  for (const word of String(text).split(" ")) {
    const next = line ? `${line} ${word}` : word;
    if (line && ctx.measureText(next).width > maxWidth) {
      lines.push(line);
      line = word;
    } else {
      line = next;
    }
  }
  if (line) lines.push(line);
  return lines;
}

function setState(node, state, label) {
  node.steadfast_state = state ?? null; // transient: not part of the workflow
  node.steadfast_label = label ?? null;
  node.setDirtyCanvas(true, true);
  drawVueVerdicts();
}

// Nodes 2.0 draws each node as a DOM element (data-node-id) and never calls onDrawForeground: the same frame and
// label are CSS rules on that element, in one stylesheet rewritten from the nodes' states. The rules name the node
// by id, so they survive the renderer re-creating the element (scrolling, collapsing); the label sits above the
// node, inside its width (wrapped), as on the canvas.
let verdictSheet = null;
const cssString = (s) => `"${String(s).replace(/[\\"]/g, "\\$&").replace(/\n/g, " ")}"`;
function drawVueVerdicts() {
  if (typeof document === "undefined") return;
  if (!verdictSheet) {
    verdictSheet = document.createElement("style");
    verdictSheet.id = "steadfast-verdicts";
    document.head.appendChild(verdictSheet);
  }
  const rules = [];
  for (const n of app.graph?.nodes ?? []) {
    const color = STATE_COLORS[n.steadfast_state];
    if (!color) continue;
    const sel = `.lg-node[data-node-id="${String(n.id).replace(/["\\]/g, "")}"]`;
    rules.push(`${sel} { outline: 4px solid ${color}; outline-offset: 2px; }`);
    if (n.steadfast_label) {
      rules.push(`${sel}::before { content: ${cssString(n.steadfast_label)}; position: absolute; left: 0; right: 0;`
                 + ` bottom: 100%; margin-bottom: 8px; color: ${color}; font: bold 12px sans-serif;`
                 + " white-space: normal; overflow-wrap: anywhere; pointer-events: none; }");
    }
  }
  verdictSheet.textContent = rules.join("\n");
}

// "Pin hash and record": copy the last run's hash and run record into expected / expected_record, so the saved
// workflow (and the PNG ComfyUI saves with it) carries its own proof. Returns false when nothing ran yet.
function pin(node) {
  const last = node.steadfast_last;
  if (!last?.hash) return false;
  const set = (name, value) => {
    const w = node.widgets?.find((x) => x.name === name);
    if (w) { w.value = value; w.callback?.(value); }
  };
  set("expected", last.hash);
  if (last.record) set("expected_record", last.record);
  if (last.reference) set("expected_reference", JSON.stringify(last.reference));
  node.setDirtyCanvas(true, true);
  return true;
}

// What a node shows for its last output (ComfyUI's "executed" message, or the same output kept by the frontend):
// the report text, the frame and the label.
function showOutput(node, message, fromCache) {
  const text = message?.text?.join("\n");
  if (text) showText(node, optimizeText(node, text, fromCache));
  if (text) markWarm(node, message);
  const h = message?.steadfast_hash?.[0];
  if (h) {
    node.steadfast_last = { hash: h.hash, record: h.record || "", reference: h.reference || null };
    const v = h.match === "unchecked" ? { state: null, label: null } : verdictState(h.verdict, h.match);
    setState(node, v.state, v.label);
  }
  const cmp = message?.steadfast_compare?.[0];
  if (cmp) showRecordDiffs(node, cmp.identical ? [] : cmp.verdict?.env_diffs);
  if (cmp) {
    const v = verdictState(cmp.verdict, cmp.identical ? "match" : "mismatch");
    // a difference the run records explain stays amber; its label still says which level
    setState(node, !cmp.identical && cmp.expected_to_differ ? "expected" : v.state,
             v.label && !cmp.identical && cmp.expected_to_differ ? `EXPECTED: ${v.label}` : v.label);
  }
}

// Optimize's report is written when Optimize runs, before anything compiled: "compile record (cold); compiles lazily
// on the first run or in Warmup". The nodes that run the model after it report the same record's state in the same
// words (a sampler's run record: "compile regional (inductor): warm, ..."). Once a node downstream of Optimize ran
// the compiled model, Optimize's line says warm too, in one word, and by whom: a Warmup, or a sampler whose run
// record's compile state is warm: "compile record (warm: compiled by Warmup in the last run)"; where that run
// compiled no graph (Dynamo ran code this server compiled earlier for the same blocks), "(warm: Optimized ran it on
// code compiled earlier)". A record Optimize found warm already says so the same way ("(warm: compiled already)"),
// never "warm; compiles lazily". So a template without Warmup no longer shows "(cold)" on Optimize beside "warm" on
// its sampler.
const LAZY = /\((\w+)\); compiles lazily on the first run or in (?:Pipeline )?Warmup\b.*$/;
const WARMUPS = { SteadfastWarmup: "SteadfastOptimizeModel", SteadfastPipelineWarmup: "SteadfastPipelineOptimize" };
const OPTIMIZERS = new Set(Object.values(WARMUPS));
// The link into input ``slot`` of ``n``: node.getInputLink(slot) where the frontend has it (1.53 and later mark
// input.link deprecated, a view of the link store), else the link id in input.link looked up in the graph.
function inputLink(n, slot, input) {
  if (!n.graph) return null;
  if (typeof n.getInputLink === "function") return n.getInputLink(slot) ?? null;
  return input.link != null ? (n.graph.links?.get?.(input.link) ?? n.graph.links?.[input.link] ?? null) : null;
}
function upstream(node) {
  const seen = new Set();
  const todo = [node];
  while (todo.length) {
    const n = todo.pop();
    for (const [slot, input] of (n.inputs ?? []).entries()) {
      const link = inputLink(n, slot, input);
      const src = link ? n.graph.getNodeById(link.origin_id) : null;
      if (src && !seen.has(src)) { seen.add(src); todo.push(src); }
    }
  }
  return [...seen];
}
// How ``node`` (reporting ``message``) left the compile record of the model it ran: the words Optimize's line takes,
// or null where it ran no compiled model, or the record is not warm after it (a compile that failed and ran eager
// says so on the sampler; Optimize's line keeps "(cold)").
function compiledBy(node, message) {
  const type = node.constructor?.comfyClass ?? node.type;
  const who = node.title ?? type;
  if (Object.hasOwn(WARMUPS, type)) return `compiled by ${who} in the last run`;
  const comp = message?.steadfast_run_record?.[0]?.compile;
  if (!comp || typeof comp !== "object" || comp.status !== "warm") return null;
  return comp.graphs_this_run ? `compiled by ${who} in the last run` : `${who} ran it on code compiled earlier`;
}
const warmLine = (text, by) => String(text).split("\n").map((line) => line.replace(LAZY, `(warm: ${by})`)).join("\n");
function markWarm(node, message) {
  const by = compiledBy(node, message);
  if (!by) return;
  for (const n of upstream(node)) {
    if (!OPTIMIZERS.has(n.constructor?.comfyClass ?? n.type)) continue;
    const w = n.widgets?.find((x) => x.name === INFO);
    if (!w?.value) continue;
    const text = warmLine(w.value, by);
    if (text === w.value) continue;
    if (n.steadfast_report) warmRecords.set(staleKey(n), { text: n.steadfast_report, by });
    showText(n, text);
  }
}
// ComfyUI answers an Optimize whose inputs did not change from its cache: the same model, the same compile record,
// and the same report, written before anything compiled ("(cold); compiles lazily ..."). Issue 46: after a run in
// which Warmup's sizes was refused (ComfyUI then runs what does not depend on Warmup: Optimize, an output node, from
// its cache), Optimize said "(cold)" again beside the sampler's "warm" from the run that compiled the record. The
// record is warm: what a node downstream said of it is kept per workflow tab and Optimize node (warmRecords, with the
// report it was said of) and said again of the same report from the cache, "in an earlier run" ("(warm: compiled by
// Warmup in an earlier run)"). An Optimize that ran anew (a new record) or wrote another report forgets it. ComfyUI
// names the nodes it answers from its cache in the api's execution_cached event, before their "executed" messages.
const warmRecords = new Map();
let cachedNow = new Set();
const earlier = (by) => by.replace(/ in the last run$/, " in an earlier run");
// Optimize's own report ``text`` (the server's), shown from a run (``fromCache``: whether ComfyUI answered it from
// its cache) or given back after a tab switch (``fromCache`` undefined): on a record seen warm, as said above; on a
// record that is warm already (a reused one), "(warm: compiled already)".
function optimizeText(node, text, fromCache) {
  if (!OPTIMIZERS.has(node.constructor?.comfyClass ?? node.type)) return text;
  node.steadfast_report = text;
  const key = staleKey(node);
  const seen = warmRecords.get(key);
  if (seen && (seen.text !== text || fromCache === false)) warmRecords.delete(key);
  else if (seen) {
    if (fromCache) seen.by = earlier(seen.by);
    const warm = warmLine(text, seen.by);
    if (warm !== text) return warm;
  }
  return text.split("\n").map((line) => {
    const m = LAZY.exec(line);
    return m && m[1] === "warm" ? line.replace(LAZY, "(warm: compiled already)") : line;
  }).join("\n");
}
function watchCache(api) {
  if (!api || api.steadfastCacheWatched || typeof api.addEventListener !== "function") return;
  const reset = () => { cachedNow = new Set(); };
  api.addEventListener("execution_cached", (e) => { cachedNow = new Set((e.detail?.nodes ?? []).map(String)); });
  for (const name of ["execution_start", "execution_success", "execution_error", "execution_interrupted"]) {
    api.addEventListener(name, reset);
  }
  api.steadfastCacheWatched = true;
}

const ourNodes = () => (app.graph?.nodes ?? []).filter((n) => NODES.has(n.constructor?.comfyClass ?? n.type));

// Switching workflow tabs loads the graph anew (no report, no frame) and then gives the frontend back the tab's
// node outputs (app.nodeOutputs, the same store that brings back a tab's images): our nodes show theirs again.
// A workflow loaded into the page has no outputs there, so it shows nothing before it runs. The graph's order is not
// the run's: a sampler can come back before the Optimize upstream of it, so Optimize's line is marked warm again
// once every report is back (markWarm).
function restoreReports() {
  const outputs = app.nodeOutputs ?? {};
  const shown = [];
  for (const node of ourNodes()) {
    const out = outputs[String(node.id)];
    const w = node.widgets?.find((x) => x.name === INFO);
    if (out?.text && !w?.value) {
      showOutput(node, out);
      const mark = staleMarks.get(staleKey(node));
      if (mark) markStale(node, mark); // STALE survives the switch: the restored report is the one it marked
      else shown.push([node, out]);
    }
  }
  for (const [node, out] of shown) markWarm(node, out);
}

// A report that no longer holds. When ComfyUI refuses one of our nodes (node_errors in its answer to the page's
// prompt), the node's last report and frame are from inputs it no longer has: the report is marked STALE and the
// frame removed. When a later prompt is accepted but stops at an error (or is interrupted) before one of our nodes
// in it reported, that node's report is from an earlier run too: the mark says so, replacing a refusal's mark
// (whose "fix the input marked red" no longer holds). The answer reaches the page only through api.queuePrompt:
// wrapped, calling through unchanged; the failure comes as the api's execution_error / execution_interrupted event,
// which lists the nodes that did run ("executed").
const STALE_MARK = "STALE (";
const REFUSED = "STALE (ComfyUI refused this node's inputs: fix the input marked red and run again). Last report:";
const lastReport = (text) => (String(text).startsWith(STALE_MARK) ? String(text).split("\n").slice(1).join("\n")
  : String(text));
// The marks, per workflow tab and node: a tab switch gives back the tab's outputs (restoreReports), which are the
// reports as they were before the mark; the mark is put back on them until the node reports again.
const staleMarks = new Map();
const staleKey = (node) => {
  const wf = activeWorkflow();
  return `${wf?.path ?? wf?.key ?? wf?.filename ?? ""}|${node.id}`;
};
function markStale(node, mark) {
  staleMarks.set(staleKey(node), mark);
  setState(node, null, null);
  const w = node.widgets?.find((x) => x.name === INFO);
  if (w?.value && !String(w.value).startsWith(`${mark}\n`)) showText(node, `${mark}\n${lastReport(w.value)}`);
}
function markRefused(nodeErrors) {
  for (const id of Object.keys(nodeErrors ?? {})) {
    const node = app.graph?.getNodeById?.(Number.isNaN(+id) ? id : +id);
    if (node && NODES.has(node.constructor?.comfyClass ?? node.type)) markStale(node, REFUSED);
  }
}
// The page's prompts, by prompt id: the graph and workflow it was queued from and the ids of the nodes in it (from
// the answer), the nodes that reported in it (the api's "executed" event, sent for a cached node too), and how it
// ended, where it stopped early (execution_error / execution_interrupted, which can come before the answer).
const runs = new Map();
function runOf(promptId) {
  if (!runs.has(promptId)) {
    runs.set(promptId, { ids: null, reported: new Set(), end: null });
    if (runs.size > 32) runs.delete(runs.keys().next().value);
  }
  return runs.get(promptId);
}
const activeWorkflow = () => app.extensionManager?.workflow?.activeWorkflow ?? null;
function markUnfinished(promptId) {
  const run = runs.get(promptId);
  if (!run?.ids || !run.end) return;
  runs.delete(promptId);
  // another workflow tab's nodes are not these
  if (run.graph !== app.graph || run.workflow !== activeWorkflow()) return;
  const [detail, interrupted] = run.end;
  for (const node of ourNodes()) {
    const id = String(node.id);
    if (!run.ids.has(id) || run.reported.has(id)) continue;
    const other = `node #${detail.node_id}${detail.node_type ? ` (${detail.node_type})` : ""}`;
    markStale(node, interrupted ? "STALE (the last run was interrupted before this node reported). Last report:"
      : String(detail.node_id) === id ? "STALE (this node failed in the last run: see the error). Last report:"
        : `STALE (the last run stopped at an error in ${other} before this node ran). Last report:`);
  }
}
function watchRefusals(api) {
  if (!api || api.steadfastWatched || typeof api.queuePrompt !== "function") return;
  const queuePrompt = api.queuePrompt;
  api.queuePrompt = async function (number, data) {
    let answer;
    try {
      answer = await queuePrompt.apply(this, arguments);
    } catch (e) {
      markRefused(e?.response?.node_errors);
      throw e;
    }
    markRefused(answer?.node_errors);
    if (answer?.prompt_id && data?.output) {
      // a refused node is not run (ComfyUI runs the rest): its mark stays the refusal's
      const ids = Object.keys(data.output).filter((id) => !(id in (answer.node_errors ?? {})));
      Object.assign(runOf(answer.prompt_id), { graph: app.graph, workflow: activeWorkflow(), ids: new Set(ids) });
      markUnfinished(answer.prompt_id);
    }
    return answer;
  };
  if (typeof api.addEventListener === "function") {
    api.addEventListener("executed", (e) => {
      const d = e.detail;
      if (d?.prompt_id) runOf(d.prompt_id).reported.add(String(d.display_node ?? d.node));
    });
    const end = (interrupted) => (e) => {
      if (!e.detail?.prompt_id) return;
      runOf(e.detail.prompt_id).end = [e.detail, interrupted];
      markUnfinished(e.detail.prompt_id);
    };
    api.addEventListener("execution_error", end(false));
    api.addEventListener("execution_interrupted", end(true));
    api.addEventListener("execution_success", (e) => runs.delete(e.detail?.prompt_id));
  }
  api.steadfastWatched = true;
}

// The three checkpoint templates name steadfast_tiny_sd15.safetensors, the tiny model the headless check builds for
// itself: a user's models folder does not have it, and frontends since 1.49 flag a combo whose value is not among
// its options as a missing model (a red error before anything ran). When a loaded graph has a widget set to that
// name and the name is not among the widget's options, the widget takes the first checkpoint whose path says
// SD1.5 (sd15, sd1.5, sd-1-5, v1-5...; the templates' note: any SD1.5 checkpoint will do). Without one the value
// stays, and the note on the canvas says what to pick. Runs in afterConfigureGraph, which the frontend awaits
// before its missing-model check.
// The Diffusers template names stable-diffusion-v1-5, a folder in models/diffusers that a user rarely has; its note
// tells how to write the pack's tiny pipeline, steadfast-tiny-sd, and the template still opened on the absent folder
// once that existed (issue 46). In a graph that holds that note, a pipeline_name not among its options takes a
// pipeline whose name says SD1.5, else steadfast-tiny-sd.
const TINY_CKPT = "steadfast_tiny_sd15.safetensors";
const TINY_PIPELINE = "steadfast-tiny-sd";
const SD15_NAME = /(^|[^a-z0-9])(sd[-_ .]?1[-_.]?5|v1[-_.]5)(?![0-9])/i;
// What was swapped is said in the template's note (the frontend's own "Note" node, top left), first, so the note
// no longer asks for what was done already.
const swappedLine = (pick, node, was) => (was === TINY_CKPT
  ? `DONE FOR YOU: ${node.title ?? node.type} now loads ${pick}, an SD1.5 checkpoint from your models folder, instead `
    + `of the template's ${TINY_CKPT} (not in your models folder). Pick another one there if you like.`
  : `DONE FOR YOU: ${node.title ?? node.type} now loads ${pick}, ${pick === TINY_PIPELINE
    ? "the pack's tiny random-weight pipeline (its pictures are noise)" : "an SD1.5 pipeline from your models/diffusers"}`
    + `, instead of the template's ${was} (not in your models/diffusers). Pick another one there if you like.`);
const noteWith = (text) => (app.graph?.nodes ?? []).find((n) => n.type === "Note"
  && String(n.widgets?.[0]?.value ?? "").includes(text));
function sayWhatWasSwapped(note, swapped) {
  const w = note?.widgets?.[0];
  if (!w || !swapped.length) return;
  const lines = swapped.map(([pick, node, was]) => swappedLine(pick, node, was))
    .filter((l) => !String(w.value).includes(l));
  if (lines.length) w.value = `${lines.join("\n")}\n\n${w.value}`;
}
function comboValues(w, node) {
  let values = w.options?.values;
  if (typeof values === "function") values = values(w, node);
  return Array.isArray(values) ? values : null;
}
function pickCheckpoint() {
  const swapped = [];
  for (const node of app.graph?.nodes ?? []) {
    for (const w of node.widgets ?? []) {
      if (w.value !== TINY_CKPT) continue;
      const values = comboValues(w, node);
      if (!values || values.includes(TINY_CKPT)) continue;
      const pick = values.find((v) => SD15_NAME.test(String(v)));
      if (pick === undefined) continue;
      w.value = pick;
      w.callback?.(pick);
      swapped.push([pick, node, TINY_CKPT]);
    }
  }
  sayWhatWasSwapped(noteWith(TINY_CKPT), swapped);
}
function pickPipeline() {
  const note = noteWith(TINY_PIPELINE);
  if (!note) return;
  const swapped = [];
  for (const node of app.graph?.nodes ?? []) {
    for (const w of node.widgets ?? []) {
      if (w.name !== "pipeline_name") continue;
      const values = comboValues(w, node);
      if (!values || values.includes(w.value)) continue;
      const pick = values.find((v) => SD15_NAME.test(String(v))) ?? values.find((v) => v === TINY_PIPELINE);
      if (pick === undefined) continue;
      const was = w.value;
      w.value = pick;
      w.callback?.(pick);
      swapped.push([pick, node, was]);
    }
  }
  sayWhatWasSwapped(note, swapped);
}

// A template's note ("Before you run": the frontend's own Note node, its text in a <textarea>) shows all its text in
// Nodes 2.0, and the nodes below it make room. There the textarea fills the node's element and does not scroll
// (1.49 on): the Diffusers template's note was cut off at its box's bottom (issue 46), and the line the pack puts
// first when it swapped a model (sayWhatWasSwapped) cut every template's note. The textarea is given at least its
// text's height (textHeight: measured on a hidden twin, never on the box, so fitting again changes nothing), and the
// element, sized by its content, grows with it (1.35.9 does not follow node.setSize there). On the classic canvas the
// note's textarea scrolls: left as it is. Only the pack's notes ("BEFORE YOU RUN"), after a graph is loaded.
const NOTE_MARK = "BEFORE YOU RUN";
function fitNotes() {
  for (const note of app.graph?.nodes ?? []) {
    if (note.type !== "Note" || !String(note.widgets?.[0]?.value ?? "").includes(NOTE_MARK)) continue;
    const el = vueNodeElement(note)?.querySelector("textarea");
    if (!el?.isConnected || el.offsetWidth < MIN_LAID_OUT_PX) continue; // not laid out yet
    const need = textHeight(el, el.offsetWidth);
    if (el.offsetHeight >= need - 1) continue;
    el.style.minHeight = `${need}px`;
    // the element takes its new height once the frontend has laid it out: then the nodes below make room
    requestAnimationFrame(() => setTimeout(() => { makeRoom(note); note.setDirtyCanvas?.(true, true); }, 50));
  }
}

app.registerExtension({
  name: "comfyui-steadfast.nodes",
  setup() { watchRefusals(app.api); watchCache(app.api); },
  afterConfigureGraph() {
    pickCheckpoint();
    pickPipeline();
    // the note is laid out a frame or more after the graph is configured (Nodes 2.0 mounts its element later)
    for (const ms of [50, 300, 1000, 2500, 5000]) requestAnimationFrame(() => setTimeout(fitNotes, ms));
    drawVueVerdicts(); // a loaded graph's nodes have no state yet: no frames left from the graph before
    // a tab switch gives back the tab's outputs right after the graph is configured
    requestAnimationFrame(restoreReports);
    setTimeout(restoreReports, 300);
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!isOurs(nodeData)) return;
    NODES.add(nodeData.name);
    if (nodeData?.input?.required?.seed?.[1]?.control_after_generate) {
      const onNodeCreated = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function () {
        const result = onNodeCreated?.apply(this, arguments);
        fixSeedControl(this);
        return result;
      };
    }
    if (nodeData.name === "SteadfastOptimizeModel") {
      const onConfigure = nodeType.prototype.onConfigure;
      nodeType.prototype.onConfigure = function (info) {
        onConfigure?.apply(this, arguments);
        migrateOptimizeWidgets(this, info, nodeData);
      };
    }
    const onConfigureAny = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function () {
      const result = onConfigureAny?.apply(this, arguments);
      shrinkEmpty(this);
      return result;
    };
    if (nodeData.name === "SteadfastHash") {
      nodeType.prototype.steadfastPin = function () { return pin(this); };
      const getExtraMenuOptions = nodeType.prototype.getExtraMenuOptions;
      nodeType.prototype.getExtraMenuOptions = function (canvas, options) {
        getExtraMenuOptions?.apply(this, arguments);
        options.push({
          content: "Pin hash and record (Steadfast)",
          disabled: !this.steadfast_last?.hash,
          callback: () => pin(this),
        });
      };
    }
    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      const color = STATE_COLORS[this.steadfast_state];
      if (!color || this.flags?.collapsed) return;
      ctx.save();
      ctx.strokeStyle = color;
      ctx.lineWidth = 4;
      const th = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
      ctx.strokeRect(-2, -th - 2, this.size[0] + 4, this.size[1] + th + 4);
      if (this.steadfast_label) {
        ctx.fillStyle = color;
        ctx.font = "bold 12px sans-serif";
        // the frontend draws the node's badges ("Steadfast") above the title bar at its right end: the label
        // keeps left of them, wrapped into lines that go upward
        const lines = wrapLabel(ctx, this.steadfast_label, Math.max(60, this.size[0] - badgesWidth(this, ctx) - 12));
        lines.forEach((line, i) => ctx.fillText(line, 0, -th - 8 - (lines.length - 1 - i) * 14));
      }
      ctx.restore();
    };
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      staleMarks.delete(staleKey(this)); // a new report: no longer stale
      showOutput(this, message, cachedNow.has(String(this.id)));
    };
  },
});
