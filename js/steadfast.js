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

// Height the report box needs for its text, measured in the DOM: a hidden twin of the box (same class, font,
// padding, border and width) holds the text and reports its scrollHeight. Frontends lay out the box from
// getMinHeight, so the text is never cut, whatever font the theme uses and however lines wrap.
let measurer = null;
function textHeight(el, node) {
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
  // the box's own width once the frontend laid it out; before that, the node's width less the widget margins
  measurer.style.width = `${el.offsetWidth > 0 ? el.offsetWidth : Math.max(60, node.size[0] - 20)}px`;
  measurer.value = el.value || " ";
  const border = measurer.offsetHeight - measurer.clientHeight; // 0 px tall: only the borders remain
  return Math.min(MAX_BOX_PX, Math.ceil(measurer.scrollHeight + border) + 2);
}

// Nodes the grown ``node`` now overlaps, and below them in turn, move down to make room (the layout keeps its
// columns; a node above or beside the grown one never moves).
function makeRoom(node) {
  const graph = node.graph;
  if (!graph) return;
  const th = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
  const nodes = graph.nodes ?? graph._nodes ?? [];
  const queue = [node];
  const moved = new Set([node]);
  while (queue.length) {
    const a = queue.shift();
    const bottom = a.pos[1] + a.size[1];
    for (const b of nodes) {
      if (moved.has(b) || b.pos[1] < a.pos[1]) continue;
      const across = b.pos[0] < a.pos[0] + a.size[0] && a.pos[0] < b.pos[0] + b.size[0];
      if (across && b.pos[1] - th < bottom + GAP_PX / 2) {
        b.pos = [b.pos[0], bottom + th + GAP_PX];
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
      getMinHeight: () => textHeight(el, node) + 2 * (w?.margin ?? 10),
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
function fitVueBox(el, node) {
  const fit = () => {
    if (!el.isConnected || !el.closest("[data-node-id]")) return;
    const key = `${el.offsetWidth}\n${el.value}`;
    if (el.steadfastFitted === key) return; // same text, same width: the height it has is right
    el.steadfastFitted = key;
    const h = `${textHeight(el, node)}px`;
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

// The report box grows with its text (up to MAX_BOX_PX, then it scrolls), so no line is cut off; the nodes
// below make room, so the grown node covers none of them.
function showText(node, text) {
  const w = node.widgets?.find((x) => x.name === INFO) ?? addInfoWidget(node);
  w.value = text;
  if (w.element) fitVueBox(w.element, node);
  const [minW, minH] = node.computeSize();
  node.setSize([Math.max(node.size[0], minW), Math.max(node.size[1], minH)]);
  makeRoom(node);
  node.setDirtyCanvas(true, true);
  // once the frontend has laid the box out at its real width, measure again (wrapping depends on it)
  requestAnimationFrame(() => {
    const [, h] = node.computeSize();
    if (h > node.size[1] + 1) {
      node.setSize([node.size[0], h]);
      makeRoom(node);
      node.setDirtyCanvas(true, true);
    }
  });
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
function showOutput(node, message) {
  const text = message?.text?.join("\n");
  if (text) showText(node, text);
  if (text) markWarm(node);
  const h = message?.steadfast_hash?.[0];
  if (h) {
    node.steadfast_last = { hash: h.hash, record: h.record || "", reference: h.reference || null };
    const v = h.match === "unchecked" ? { state: null, label: null } : verdictState(h.verdict, h.match);
    setState(node, v.state, v.label);
  }
  const cmp = message?.steadfast_compare?.[0];
  if (cmp) {
    const v = verdictState(cmp.verdict, cmp.identical ? "match" : "mismatch");
    // a difference the run records explain stays amber; its label still says which level
    setState(node, !cmp.identical && cmp.expected_to_differ ? "expected" : v.state,
             v.label && !cmp.identical && cmp.expected_to_differ ? `EXPECTED: ${v.label}` : v.label);
  }
}

// Optimize's report is written when Optimize runs, before Warmup compiles: once a Warmup downstream of it has
// run, its "compile record (cold)" line says that Warmup made the model warm.
const WARMUPS = { SteadfastWarmup: "SteadfastOptimizeModel", SteadfastPipelineWarmup: "SteadfastPipelineOptimize" };
function upstream(node) {
  const seen = new Set();
  const todo = [node];
  while (todo.length) {
    const n = todo.pop();
    for (const input of n.inputs ?? []) {
      const link = input.link != null ? (n.graph?.links?.get?.(input.link) ?? n.graph?.links?.[input.link]) : null;
      const src = link ? n.graph.getNodeById(link.origin_id) : null;
      if (src && !seen.has(src)) { seen.add(src); todo.push(src); }
    }
  }
  return [...seen];
}
function markWarm(warmup) {
  const optimizeType = WARMUPS[warmup.constructor?.comfyClass ?? warmup.type];
  if (!optimizeType) return;
  for (const n of upstream(warmup)) {
    if ((n.constructor?.comfyClass ?? n.type) !== optimizeType) continue;
    const w = n.widgets?.find((x) => x.name === INFO);
    if (!w?.value) continue;
    const text = String(w.value).split("\n").map((line) => (/compiles lazily/.test(line) && /\bcold\b/.test(line)
      ? `${line.replace(/\bcold\b/, "warm")} (warmed by ${warmup.title ?? "Warmup"} in the last run)` : line)).join("\n");
    if (text !== w.value) showText(n, text);
  }
}

const ourNodes = () => (app.graph?.nodes ?? []).filter((n) => NODES.has(n.constructor?.comfyClass ?? n.type));

// Switching workflow tabs loads the graph anew (no report, no frame) and then gives the frontend back the tab's
// node outputs (app.nodeOutputs, the same store that brings back a tab's images): our nodes show theirs again.
// A workflow loaded into the page has no outputs there, so it shows nothing before it runs.
function restoreReports() {
  const outputs = app.nodeOutputs ?? {};
  for (const node of ourNodes()) {
    const out = outputs[String(node.id)];
    const w = node.widgets?.find((x) => x.name === INFO);
    if (out?.text && !w?.value) showOutput(node, out);
  }
}

// A report that no longer holds: when ComfyUI refuses one of our nodes (node_errors in its answer to the page's
// prompt), the node's last report and frame are from inputs it no longer has, so the report is marked stale and
// the frame removed. The answer reaches the page only through api.queuePrompt: wrapped, calling through unchanged.
const STALE = "STALE (ComfyUI refused this node's inputs: fix the input marked red and run again). Last report:";
function markStale(nodeErrors) {
  for (const id of Object.keys(nodeErrors ?? {})) {
    const node = app.graph?.getNodeById?.(Number.isNaN(+id) ? id : +id);
    if (!node || !NODES.has(node.constructor?.comfyClass ?? node.type)) continue;
    setState(node, null, null);
    const w = node.widgets?.find((x) => x.name === INFO);
    if (w?.value && !String(w.value).startsWith(STALE)) showText(node, `${STALE}\n${w.value}`);
  }
}
function watchRefusals(api) {
  if (!api || api.steadfastWatched || typeof api.queuePrompt !== "function") return;
  const queuePrompt = api.queuePrompt;
  api.queuePrompt = async function () {
    let answer;
    try {
      answer = await queuePrompt.apply(this, arguments);
    } catch (e) {
      markStale(e?.response?.node_errors);
      throw e;
    }
    markStale(answer?.node_errors);
    return answer;
  };
  api.steadfastWatched = true;
}

app.registerExtension({
  name: "comfyui-steadfast.nodes",
  setup() { watchRefusals(app.api); },
  afterConfigureGraph() {
    drawVueVerdicts(); // a loaded graph's nodes have no state yet: no frames left from the graph before
    // a tab switch gives back the tab's outputs right after the graph is configured
    requestAnimationFrame(restoreReports);
    setTimeout(restoreReports, 300);
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!isOurs(nodeData)) return;
    NODES.add(nodeData.name);
    if (nodeData.name === "SteadfastOptimizeModel") {
      const onConfigure = nodeType.prototype.onConfigure;
      nodeType.prototype.onConfigure = function (info) {
        onConfigure?.apply(this, arguments);
        migrateOptimizeWidgets(this, info, nodeData);
      };
    }
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
      showOutput(this, message);
    };
  },
});
