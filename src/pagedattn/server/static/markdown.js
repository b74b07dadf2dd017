// Markdown to DOM nodes, safely: every piece of text goes in through textContent or
// createTextNode, never innerHTML, so model output can never run as HTML or script.
// Covers what chat models write: fenced code blocks, headings, lists, quotes, rules, tables,
// paragraphs; inline code, bold, italic, strikethrough and http(s) links.

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*\s](?:[^*]*[^*\s])?)\*\*|(^|[^\w])__([^_\s](?:[^_]*[^_\s])?)__(?!\w)|~~([^~]+)~~|\*([^*\s](?:[^*]*[^*\s])?)\*|(^|[^\w])_([^_\s](?:[^_]*[^_\s])?)_(?!\w)|\[([^\]]+)\]\(([^)\s]+)\)/g;

function safeUrl(href) {
  try {
    const url = new URL(href, window.location.href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

export function renderInline(text, parent) {
  const re = new RegExp(INLINE.source, "g"); // its own lastIndex: the calls nest
  let last = 0;
  for (let m = re.exec(text); m !== null; m = re.exec(text)) {
    // the character before __bold__ / _italic_ (not part of the emphasis)
    const start = m.index + (m[4] ?? m[8] ?? "").length;
    parent.appendChild(document.createTextNode(text.slice(last, start)));
    if (m[2] !== undefined) parent.appendChild(el("code", "inline", m[2]));
    else if (m[3] !== undefined || m[5] !== undefined) {
      renderInline(m[3] ?? m[5], parent.appendChild(el("strong")));
    } else if (m[6] !== undefined) renderInline(m[6], parent.appendChild(el("del")));
    else if (m[7] !== undefined || m[9] !== undefined) {
      renderInline(m[7] ?? m[9], parent.appendChild(el("em")));
    } else {
      const href = safeUrl(m[11]);
      if (href === null) parent.appendChild(document.createTextNode(m[0]));
      else {
        const a = el("a", "", m[10]);
        a.href = href;
        a.target = "_blank";
        a.rel = "noopener noreferrer nofollow";
        parent.appendChild(a);
      }
    }
    last = re.lastIndex;
  }
  parent.appendChild(document.createTextNode(text.slice(last)));
}

function codeBlock(lang, code) {
  const wrap = el("div", "codeblock");
  const bar = el("div", "codebar");
  bar.appendChild(el("span", "lang", lang || "text"));
  const copy = el("button", "copy", "Copy");
  copy.type = "button";
  copy.addEventListener("click", () => {
    navigator.clipboard?.writeText(code).then(() => {
      copy.textContent = "Copied";
      setTimeout(() => { copy.textContent = "Copy"; }, 1200);
    });
  });
  bar.appendChild(copy);
  const pre = el("pre");
  pre.appendChild(el("code", "", code));
  wrap.append(bar, pre);
  return wrap;
}

function tableRow(line) {
  return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
}

const BLOCK_START = /^(```|~~~|#{1,6}\s|>\s?|\s*([-*+]|\d+[.)])\s+|\s*([-*_])(\s*\3){2,}\s*$)/;

export function renderMarkdown(text, container) {
  container.replaceChildren();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```|~~~)\s*([\w+#.-]*)/);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1; // the closing fence (or the end of a reply still streaming)
      container.appendChild(codeBlock(fence[2], body.join("\n")));
      continue;
    }
    if (!line.trim()) { i += 1; continue; }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      renderInline(heading[2], container.appendChild(el(`h${Math.min(6, heading[1].length + 2)}`)));
      i += 1;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      container.appendChild(el("hr"));
      i += 1;
      continue;
    }
    if (/^>\s?/.test(line)) {
      const quoted = [];
      while (i < lines.length && /^>\s?/.test(lines[i])) quoted.push(lines[i++].replace(/^>\s?/, ""));
      renderMarkdown(quoted.join("\n"), container.appendChild(el("blockquote")));
      continue;
    }
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      const ordered = /\d/.test(item[1]);
      const list = container.appendChild(el(ordered ? "ol" : "ul"));
      if (ordered && parseInt(item[1], 10) !== 1) list.start = parseInt(item[1], 10);
      while (i < lines.length) {
        const m = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
        if (m && /\d/.test(m[1]) === ordered) {
          renderInline(m[2], list.appendChild(el("li")));
        } else if (lines[i].trim() && /^\s{2,}/.test(lines[i]) && list.lastChild) {
          list.lastChild.appendChild(document.createTextNode(" "));
          renderInline(lines[i].trim(), list.lastChild);
        } else break;
        i += 1;
      }
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/.test(lines[i + 1])) {
      const table = container.appendChild(el("table"));
      const head = table.appendChild(el("thead")).appendChild(el("tr"));
      for (const cell of tableRow(line)) renderInline(cell, head.appendChild(el("th")));
      const body = table.appendChild(el("tbody"));
      i += 2;
      while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
        const row = body.appendChild(el("tr"));
        for (const cell of tableRow(lines[i++])) renderInline(cell, row.appendChild(el("td")));
      }
      continue;
    }
    const para = container.appendChild(el("p"));
    let first = true;
    while (i < lines.length && lines[i].trim() && !(BLOCK_START.test(lines[i]) && !first)) {
      if (!first) para.appendChild(el("br"));
      renderInline(lines[i++], para);
      first = false;
    }
  }
}
