// ComfyUI-Steadfast frontend: show hash, match state, comparison and compile state on our nodes
// after they execute. Uses the documented extension hooks (beforeRegisterNodeDef + onExecuted).
import { app } from "../../scripts/app.js";

const NODES = new Set([
  "SteadfastDeterminismSetup", "SteadfastOptimizeModel", "SteadfastSeededSampler",
  "SteadfastWarmup", "SteadfastHash", "SteadfastCompare",
]);

const MATCH_COLORS = { match: "#2e7d32", mismatch: "#c62828", unchecked: null };

function showText(node, text) {
  let w = node.widgets?.find((x) => x.name === "steadfast_info");
  if (!w) {
    w = node.addWidget("text", "steadfast_info", "", () => {}, { serialize: false });
    w.serialize = false; // never saved into widgets_values: saved workflows stay loadable
    if (w.inputEl) { w.inputEl.readOnly = true; w.inputEl.style.opacity = 0.85; }
  }
  w.value = text;
  node.setDirtyCanvas(true, true);
}

app.registerExtension({
  name: "steadfast.nodes",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
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
