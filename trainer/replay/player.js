// The replay player: one sample's generation, network call by network call.
//
// It reads the data that aogpt.trainer.replay.page_data writes (its docstring has the format) and
// builds, inside a container, the controls (sample picker, play/pause, steps, a slider over the
// calls), the sequence as cells (a row that wraps, or a grid), the text decoded so far and the
// sample's facts. The state after call k is recomputed from the start on every move, so stepping
// back undoes a call exactly; it is a pass over the calls, a few thousand operations.
"use strict";

const BYTES = new TextDecoder("utf-8", {ignoreBOM: true});  // keeps a leading BOM, as Python
const STRICT = new TextDecoder("utf-8", {fatal: true, ignoreBOM: true});
const ENCODER = new TextEncoder();
const SPEEDS = [1, 2, 5, 10, 25, 50, 100, 250, 1000];  // calls per second
const PLAY_SECONDS = 12;  // the default speed plays a sample in about this long
const PLAY = "\u25b6 play", PAUSE = "\u275a\u275a pause";  // glyphs of common fonts

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

// A vocabulary piece: a token's bytes, stored as a string when they are UTF-8 on their own
class Vocabulary {
  constructor(pieces, join) {
    this.join = join;  // "bytes": a text is its tokens' bytes; "words": its ids, spaced
    this.bytes = pieces.map(p => typeof p === "string" ? ENCODER.encode(p) : Uint8Array.from(p));
    this.labels = pieces.map((p, i) => this.label(p, this.bytes[i]));
  }

  label(piece, bytes) {
    if (typeof piece !== "string") {  // a part of a character: its bytes
      try { piece = STRICT.decode(bytes); } catch (e) {
        return Array.from(bytes, b => "\\x" + b.toString(16).padStart(2, "0")).join("");
      }
    }
    return piece.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(/\r/g, "\u240d");
  }

  // the text of consecutive tokens (local ids), as the sample's decoder writes it
  decode(ids) {
    if (this.join === "words") return ids.map(id => BYTES.decode(this.bytes[id])).join(" ");
    let size = 0;
    for (const id of ids) size += this.bytes[id].length;
    const all = new Uint8Array(size);
    let at = 0;
    for (const id of ids) { all.set(this.bytes[id], at); at += this.bytes[id].length; }
    return BYTES.decode(all);
  }
}

// What a sample's cells hold after its first k calls (k = 0: the given tokens only)
function stateAt(sample, k) {
  const n = sample.tokens.length;
  const cells = Array.from({length: n}, () => ({kind: "masked"}));
  for (const p of sample.given) cells[p] = {kind: "given", token: sample.tokens[p]};
  let next = 0;  // entries of the order made final so far
  for (let c = 0; c < k; c++) {
    const event = (sample.events && sample.events[c]) || {};
    for (const [p, token] of event.r || []) cells[p].rejected = token;
    for (const p of event.a || []) cells[p].accepted = true;
    const scores = new Map((event.c || []).map(([p, score]) => [p, score]));
    const count = sample.reveals ? sample.reveals[c] : 1;
    for (const p of sample.order.slice(next, next + count)) {
      const cell = cells[p];
      Object.assign(cell, {kind: "final", token: sample.tokens[p], call: c,
                           how: cell.accepted ? "accepted" : cell.rejected !== undefined
                             ? "redrawn" : "drawn"});
      if (scores.has(p)) Object.assign(cell, {score: scores.get(p), candidates: scores.size});
    }
    next += count;
    for (const [p, token] of event.d || []) {
      if (cells[p].kind !== "final") Object.assign(cells[p], {kind: "draft", token, drafted: c});
    }
  }
  const last = k > 0 && sample.events ? sample.events[k - 1] || {} : {};
  const candidates = (last.c || []).map(([p, score], rank) => ({p, score, rank}));
  return {cells, call: k, candidates};
}

class Player {
  constructor(root, data) {
    this.root = root;
    this.data = data;
    this.vocab = new Vocabulary(data.pieces, data.join);
    this.timer = null;
    this.build();
    this.choose(0);
    root.dataset.ready = "1";
  }

  build() {
    const samples = this.data.samples;
    this.picker = el("select", {class: "picker", "aria-label": "sample", onchange: () =>
      this.choose(Number(this.picker.value))});
    samples.forEach((s, i) => this.picker.append(el("option", {value: i, text: s.label})));
    this.playButton = el("button", {class: "play", title: "play / pause (space)",
                                    onclick: () => this.toggle()}, PLAY);
    const button = (text, title, action, cls) => el("button", {class: cls, title, onclick: action},
                                                    text);
    this.slider = el("input", {type: "range", class: "slider", min: 0, value: 0,
                               "aria-label": "network call",
                               oninput: () => { this.pause(); this.show(Number(this.slider.value)); }});
    this.speed = el("select", {class: "speed", "aria-label": "speed", title: "calls per second"});
    for (const s of SPEEDS) this.speed.append(el("option", {value: s, text: `${s} call${s === 1 ? "" : "s"}/s`}));
    this.speed.addEventListener("change", () => { if (this.timer) { this.pause(); this.play(); } });
    this.position = el("span", {class: "position"});
    const controls = el("div", {class: "controls"},
      this.picker,
      button("\u21e4 start", "to the start (Home)", () => { this.pause(); this.show(0); },
             "first"),
      button("\u2039 back", "step back one call (\u2190)", () => this.step(-1), "back"),
      this.playButton,
      button("step \u203a", "step forward one call (\u2192)", () => this.step(1), "forward"),
      button("end \u21e5", "to the end (End)", () => { this.pause(); this.show(this.total); },
             "last"),
      this.slider, this.position, this.speed);
    this.facts = el("dl", {class: "facts"});
    this.cells = el("div", {class: "cells"});
    this.text = el("div", {class: "text"});
    this.tip = el("div", {class: "tip", hidden: ""});
    this.cells.addEventListener("mousemove", e => this.hover(e));
    this.cells.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.root.append(controls, this.legend(), this.cells,
                     el("h2", {text: "text so far"}), this.text, this.facts, this.tip);
    document.addEventListener("keydown", e => this.key(e));
  }

  legend() {
    const items = [["given", "given"], ["new", "revealed by this call"], ["final", "final"],
                   ["draft", "draft (pending)"], ["accepted", "draft accepted"],
                   ["redrawn", "draft rejected, redrawn"], ["candidate", "planner's candidate"],
                   ["masked", "not yet generated"]];
    return el("div", {class: "legend"}, ...items.map(([cls, text]) =>
      el("span", {class: `cell ${cls}`, text})));
  }

  choose(index) {
    this.pause();
    this.sample = this.data.samples[index];
    this.picker.value = index;
    const s = this.sample;
    this.total = s.reveals ? s.reveals.length : s.order.length;
    this.slider.max = this.total;
    const wanted = this.total / PLAY_SECONDS;
    this.speed.value = SPEEDS.find(v => v >= wanted) || SPEEDS[SPEEDS.length - 1];
    this.facts.replaceChildren(...s.facts.flatMap(([name, value]) =>
      [el("dt", {text: name}), el("dd", {text: value})]));
    this.layout(s);
    this.show(0);
  }

  layout(s) {
    const grid = this.data.grid;  // Sudoku: [rows, cols, box_rows, box_cols]
    this.cells.classList.toggle("grid", Boolean(grid));
    if (grid) this.cells.style.gridTemplateColumns = `repeat(${grid[1]}, 2.2em)`;
    const seams = new Set(s.seams || []);
    const wrong = new Set(s.wrong || []);
    this.cellNodes = s.tokens.map((_, p) => {
      const node = el("span", {"data-p": p});
      if (seams.has(p)) node.dataset.seam = "1";
      if (wrong.has(p)) node.dataset.wrong = "1";
      if (grid) {
        const row = Math.floor(p / grid[1]), col = p % grid[1];
        if (col % grid[3] === 0 && col) node.dataset.boxLeft = "1";
        if (row % grid[2] === 0 && row) node.dataset.boxTop = "1";
      }
      return node;
    });
    this.cells.replaceChildren(...this.cellNodes);
  }

  show(k) {
    this.state = stateAt(this.sample, Math.max(0, Math.min(k, this.total)));
    const {cells, call} = this.state;
    const scored = new Map(this.state.candidates.map(c => [c.p, c]));
    const best = this.state.candidates.length ? this.state.candidates[0].score : 0;
    const worst = this.state.candidates.length
      ? this.state.candidates[this.state.candidates.length - 1].score : 0;
    cells.forEach((cell, p) => {
      const node = this.cellNodes[p];
      let cls = "cell " + cell.kind;
      if (cell.kind === "final") {
        cls += cell.call === call - 1 ? " new" : "";
        if (cell.how !== "drawn") cls += " " + cell.how;
      }
      const candidate = scored.get(p);
      node.style.removeProperty("--heat");
      if (candidate && cell.kind !== "final") {
        cls += " candidate";
        const heat = best === worst ? 1 : (candidate.score - worst) / (best - worst);
        node.style.setProperty("--heat", heat.toFixed(3));
      }
      if (node.className !== cls) node.className = cls;
      const label = cell.token === undefined ? "" : this.vocab.labels[cell.token];
      if (node.textContent !== label) node.textContent = label;
    });
    this.slider.value = call;
    this.position.textContent = `call ${call} of ${this.total}`;
    this.root.dataset.call = call;
    this.root.dataset.done = call === this.total ? "1" : "0";
    this.showText(cells);
  }

  // the text of the tokens known so far; a run of unknown positions shows as one mark
  showText(cells) {
    const parts = [], separator = this.vocab.join === "words" ? " " : "";
    let run = [], inHole = false;
    const add = node => {
      if (parts.length && separator) parts.push(document.createTextNode(separator));
      parts.push(node);
    };
    const flush = () => {
      if (run.length) add(document.createTextNode(this.vocab.decode(run)));
      run = [];
    };
    for (const cell of cells) {
      if (cell.kind === "given" || cell.kind === "final") {
        run.push(cell.token);
        inHole = false;
      } else {
        flush();
        if (!inHole) add(el("span", {class: "hole", text: "\u2026"}));
        inHole = true;
      }
    }
    flush();
    this.text.replaceChildren(...parts);
  }

  step(delta) {
    this.pause();
    this.show(this.state.call + delta);
  }

  toggle() { this.timer ? this.pause() : this.play(); }

  play() {
    if (this.state.call >= this.total) this.show(0);
    this.playButton.textContent = PAUSE;
    this.root.dataset.playing = "1";
    let last = performance.now(), owed = 0;
    const tick = now => {
      owed += (now - last) / 1000 * Number(this.speed.value);
      last = now;
      if (owed >= 1) {
        const calls = Math.floor(owed);
        owed -= calls;
        this.show(this.state.call + calls);
      }
      if (this.state.call >= this.total) this.pause();
      else this.timer = requestAnimationFrame(tick);
    };
    this.timer = requestAnimationFrame(tick);
  }

  pause() {
    if (this.timer) cancelAnimationFrame(this.timer);
    this.timer = null;
    this.playButton.textContent = PLAY;
    this.root.dataset.playing = "0";
  }

  key(e) {
    const actions = {" ": () => this.toggle(), ArrowRight: () => this.step(1),
                     ArrowLeft: () => this.step(-1), Home: () => { this.pause(); this.show(0); },
                     End: () => { this.pause(); this.show(this.total); }};
    const typing = ["INPUT", "SELECT", "TEXTAREA", "BUTTON"].includes(e.target.tagName);
    if (actions[e.key] && !typing && this.root.isConnected) {
      e.preventDefault();
      actions[e.key]();
    }
  }

  hover(e) {
    const node = e.target.closest("[data-p]");
    if (!node) { this.tip.hidden = true; return; }
    const p = Number(node.dataset.p);
    this.tip.textContent = this.describe(p);
    this.tip.hidden = false;
    const box = this.root.getBoundingClientRect();
    this.tip.style.left = `${e.clientX - box.left + 12}px`;
    this.tip.style.top = `${e.clientY - box.top + 16}px`;
  }

  // what a cell's tooltip says: its position, its token and how it got there
  describe(p) {
    const cell = this.state.cells[p];
    const lines = [`position ${p}`];
    const token = t => `${JSON.stringify(this.vocab.labels[t])} (id ${this.data.ids[t]})`;
    if (cell.kind === "given") lines.push(`given ${token(cell.token)}`);
    if (cell.kind === "final") {
      const how = {drawn: "drawn", accepted: "draft accepted", redrawn: "redrawn"}[cell.how];
      lines.push(`${token(cell.token)}: ${how} at call ${cell.call + 1}`);
      if (cell.rejected !== undefined) lines.push(`rejected draft ${token(cell.rejected)}`);
      if (cell.score !== undefined) {
        lines.push(`chosen with score ${cell.score} (of ${cell.candidates} candidates)`);
      }
    }
    if (cell.kind === "draft") lines.push(`draft ${token(cell.token)} from call ${cell.drafted + 1}`);
    if (cell.kind === "masked") lines.push("not yet generated");
    const candidate = this.state.candidates.find(c => c.p === p);
    if (candidate && cell.kind !== "final") {
      lines.push(`candidate of call ${this.state.call}: score ${candidate.score}, ` +
                 `rank ${candidate.rank + 1} of ${this.state.candidates.length}`);
    }
    if (this.sample.seams && this.sample.seams.includes(p)) {
      lines.push("window seam: a new chunk begins generating here");
    }
    if (this.sample.wrong && this.sample.wrong.includes(p)) lines.push("wrong: the verifier's mark");
    return lines.join("\n");
  }
}

window.ReplayPlayer = Player;
