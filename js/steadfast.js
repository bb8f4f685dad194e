// ComfyUI-Steadfast frontend: show hash, match state, comparison and compile state on our nodes
// after they execute. Uses the documented extension hooks (beforeRegisterNodeDef + onExecuted).
import { app } from "../../scripts/app.js";

const NODES = new Set([
  "SteadfastDeterminismSetup", "SteadfastOptimizeModel", "SteadfastSeededSampler",
  "SteadfastWarmup", "SteadfastHash", "SteadfastCompare",
  "SteadfastPipelineSampler", "SteadfastPipelineOptimize", "SteadfastPipelineWarmup",
  "SteadfastPipelineDeterminismSetup", "SteadfastLoadDiffusersPipeline", "SteadfastPipelineLoRA",
]);

// Optimize Model lost its two pipeline-only widgets (vae_slicing, vae_tiling: now on Pipeline Optimize).
// widgets_values are positional, so a workflow saved with them would shift strict_recompiles and
// compile_cache by two: map such a saved list by the old widget names instead.
const OPTIMIZE_OLD_WIDGETS = [
  "qkv_fusion", "channels_last", "attention", "compile", "backend", "mode", "dynamic", "fullgraph",
  "vae_slicing", "vae_tiling", "strict_recompiles", "compile_cache",
];

function migrateOptimizeWidgets(node, info) {
  const saved = info?.widgets_values;
  if (!Array.isArray(saved) || saved.length !== OPTIMIZE_OLD_WIDGETS.length) return;
  OPTIMIZE_OLD_WIDGETS.forEach((name, i) => {
    const w = node.widgets?.find((x) => x.name === name);
    if (w) w.value = saved[i];
  });
}

const MATCH_COLORS = { match: "#2e7d32", mismatch: "#c62828", unchecked: null };

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
    const w = node.addDOMWidget(INFO, "steadfast_info", el, {
      getValue: () => el.value,
      setValue: (v) => { el.value = v ?? ""; },
      serialize: false,
      getMinHeight: () => 64,
    });
    w.serialize = false; // never saved into widgets_values: saved workflows stay loadable
    return w;
  }
  const w = node.addWidget("text", INFO, "", () => {}, { serialize: false });
  w.serialize = false;
  return w;
}

function showText(node, text) {
  const w = node.widgets?.find((x) => x.name === INFO) ?? addInfoWidget(node);
  w.value = text;
  const [minW, minH] = node.computeSize();
  node.setSize([Math.max(node.size[0], minW), Math.max(node.size[1], minH)]);
  node.setDirtyCanvas(true, true);
}

app.registerExtension({
  name: "comfyui-steadfast.nodes",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
    if (nodeData.name === "SteadfastOptimizeModel") {
      const onConfigure = nodeType.prototype.onConfigure;
      nodeType.prototype.onConfigure = function (info) {
        onConfigure?.apply(this, arguments);
        migrateOptimizeWidgets(this, info);
      };
    }
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const text = message?.text?.join("\n");
      if (text) showText(this, text);
      const h = message?.steadfast_hash?.[0];
      if (h) {
        const c = MATCH_COLORS[h.match];
        this.bgcolor = c ?? undefined;
      }
      const cmp = message?.steadfast_compare?.[0];
      if (cmp) this.bgcolor = cmp.identical ? MATCH_COLORS.match : MATCH_COLORS.mismatch;
    };
  },
});
