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

export function toast(message, kind = 'info') {
  const el = document.getElementById('toast')
  el.textContent = message
  el.className = `show ${kind}`
  clearTimeout(toast.timer)
  toast.timer = setTimeout(() => (el.className = ''), 5000)
}

export function when(iso) {
  if (!iso) return '—'
  const d = new Date(iso)
  return d.toLocaleString(undefined, { hour12: false })
}
