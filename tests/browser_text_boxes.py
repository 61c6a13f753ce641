"""What the browser tests measure of a page's layout (tests/test_teach_browser.py, tests/test_browser_report.py)."""

# The page's own layout, measured in the browser: a box for every visible text (each line of an HTML text node, from
# a Range; each SVG <text> of the figures), and, as obstacles, each figure's legend box and its mode bar (shown on
# hover or tap). Returns the pairs of boxes that overlap by more than a pixel each way, and the texts that stick out
# of what clips them: an SVG clip-path (a plot's area), the <svg> itself, an HTML ancestor that hides its overflow,
# or the page's width.
TEXT_BOXES_JS = """
const EPS = 1, boxes = [];
const visible = (el) => {
  for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
    const cs = getComputedStyle(e);
    if (cs.display === 'none' || cs.visibility === 'hidden' || parseFloat(cs.opacity) === 0) return false;
  }
  return true;
};
const name = (el) => {
  const fig = el.closest('.dash-graph') || el.closest('.plotly-graph-div');
  return (fig ? fig.id + ' ' : '') + (el.getAttribute('class') || el.parentElement.getAttribute('class') || el.tagName);
};
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let n = walker.nextNode(); n; n = walker.nextNode()) {
  const el = n.parentElement;
  if (!n.textContent.trim() || el.closest('svg, script, style, option, select') || !visible(el)) continue;
  const r = document.createRange();
  r.selectNodeContents(n);
  for (const b of r.getClientRects()) {
    if (b.width > 0 && b.height > 0) boxes.push({el, text: n.textContent.trim().slice(0, 40), what: name(el), b});
  }
}
for (const t of document.querySelectorAll('.js-plotly-plot svg text')) {
  const b = t.getBoundingClientRect();
  if (t.textContent.trim() && visible(t) && b.width > 0 && b.height > 0) {
    boxes.push({el: t, text: t.textContent.trim().slice(0, 40), what: name(t), b});
  }
}
for (const g of document.querySelectorAll('.js-plotly-plot g.legend, .js-plotly-plot .modebar')) {
  const b = (g.querySelector('rect.bg') || g).getBoundingClientRect();
  if (b.width > 0 && b.height > 0) boxes.push({el: g, text: '', what: name(g), b, solid: true});
}
const overlaps = [];
for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
  const a = boxes[i], c = boxes[j];
  if (a.el === c.el || a.el.contains(c.el) || c.el.contains(a.el) || (a.solid && c.solid)) continue;
  if ((a.solid || c.solid) && a.el.closest('.js-plotly-plot') !== c.el.closest('.js-plotly-plot')) continue;
  const w = Math.min(a.b.right, c.b.right) - Math.max(a.b.left, c.b.left);
  const h = Math.min(a.b.bottom, c.b.bottom) - Math.max(a.b.top, c.b.top);
  if (w > EPS && h > EPS) {
    overlaps.push(`${a.what} "${a.text}" x ${c.what} "${c.text}" (${w.toFixed(1)} x ${h.toFixed(1)} px)`);
  }
}
const clips = (el) => {
  const out = [];
  for (let e = el.parentElement; e && e !== document.documentElement; e = e.parentElement) {
    const ref = e.getAttribute('clip-path');
    const id = ref && ref.match(/url\\(["']?#([^"')]+)/);
    const rect = id && document.getElementById(id[1]) && document.getElementById(id[1]).querySelector('rect');
    if (rect && e.getScreenCTM) {  // the clip rectangle in the element's own coordinates, to the viewport's
      const m = e.getScreenCTM(), x = +rect.getAttribute('x') || 0, y = +rect.getAttribute('y') || 0;
      const p = new DOMPoint(x, y).matrixTransform(m);
      const q = new DOMPoint(x + +rect.getAttribute('width'), y + +rect.getAttribute('height')).matrixTransform(m);
      out.push({what: 'its plot area', left: Math.min(p.x, q.x), right: Math.max(p.x, q.x),
                top: Math.min(p.y, q.y), bottom: Math.max(p.y, q.y)});
    }
    if (e.tagName.toLowerCase() === 'svg') {
      out.push({what: 'its svg', ...e.getBoundingClientRect().toJSON()});
    } else if (!(e instanceof SVGElement)) {
      const cs = getComputedStyle(e);
      if (cs.overflowX !== 'visible' || cs.overflowY !== 'visible') {
        const r = e.getBoundingClientRect().toJSON();
        out.push({what: 'the overflow of ' + (e.id || e.className || e.tagName), ...r});
      }
    }
  }
  out.push({what: 'the page width', left: 0, right: document.documentElement.clientWidth, top: -Infinity,
            bottom: Infinity});
  return out;
};
const clipped = [];
for (const a of boxes) if (!a.solid) for (const c of clips(a.el)) {
  const over = Math.max(c.left - a.b.left, a.b.right - c.right, c.top - a.b.top, a.b.bottom - c.bottom);
  if (over > EPS) { clipped.push(`${a.what} "${a.text}" cut by ${c.what} (${over.toFixed(1)} px)`); break; }
}
const texts = boxes.filter(a => !a.solid).map(a => a.text);
return {texts, overlaps, clipped, scrollWidth: document.documentElement.scrollWidth,
        width: document.documentElement.clientWidth};
"""
