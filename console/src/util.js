// Small DOM and formatting helpers (no framework: the pages are tables and forms).
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag)
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value)
    else if (key === 'class') el.className = value
    else if (key === 'dataset') Object.assign(el.dataset, value)
    else el.setAttribute(key, value === true ? '' : String(value))
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue
    el.append(child instanceof Node ? child : document.createTextNode(String(child)))
  }
  return el
}

// Text the server sends (patient name and ID, accession, labels, model names, user and
// key names, reasons) in a <bdi>: its own direction (an Arabic or Hebrew name, a U+202E
// override in a header) cannot reorder the text around it. Table cells and flex items
// are paragraphs of their own already; text inline beside other text needs this.
// Isolate controls of its own (U+2066-U+2069, invisible) are dropped: a stray POP
// DIRECTIONAL ISOLATE could end the isolation early.
const ISOLATES = /[\u2066-\u2069]/g
export const iso = (value) => h('bdi', {}, String(value).replace(ISOLATES, ''))

// Header text (patient name and ID, accession, key and user names) on one line, cut
// with an ellipsis where its box ends, the whole text in its tooltip: a DICOM header may
// hold a 64-character name without a space, or a hostile 10,000-character one, and
// neither may push the page's buttons out of view (style.css: .clip).
export const clip = (value) => {
  const text = String(value).replace(ISOLATES, '')
  return h('bdi', { class: 'clip', title: text }, text)
}

// the longest header text a plain-text place (window.confirm) shows: the rest is '…'
const SHORT = 64

// the same for plain-text places (window.confirm): FIRST STRONG ISOLATE ... POP
// DIRECTIONAL ISOLATE around it, at most SHORT characters of it
export const isoText = (value) => {
  const text = [...String(value).replace(ISOLATES, '')]
  return `\u2068${text.length > SHORT ? `${text.slice(0, SHORT - 1).join('')}…` : text.join('')}\u2069`
}

// bidi controls in text shown as code (the audit payload's JSON): written as \uXXXX
const BIDI_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g
export const inert = (text) => text.replace(BIDI_CONTROLS, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)

export function duration(seconds) {
  const s = Math.abs(Math.round(seconds))
  const sign = seconds < 0 ? '-' : ''
  if (s < 60) return `${sign}${s}s`
  if (s < 3600) return `${sign}${Math.floor(s / 60)}m ${String(s % 60).padStart(2, '0')}s`
  if (s < 86400) return `${sign}${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`
  return `${sign}${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`
}

export const num = (value, digits = 1) =>
  value === null || value === undefined ? '—' : Number(value).toFixed(digits)

// ``message``: text, or an array of text and nodes (server text in iso())
export function toast(message, kind = 'info') {
  const el = document.getElementById('toast')
  el.replaceChildren(...[message].flat())
  el.className = `show ${kind}`
  clearTimeout(toast.timer)
  toast.timer = setTimeout(() => (el.className = ''), 5000)
}

export function when(iso) {
  if (!iso) return '—'
  const d = new Date(iso)
  return d.toLocaleString(undefined, { hour12: false })
}
