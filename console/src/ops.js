// Operations: queues, turnaround, misses, devices, batches (the server's own metrics),
// the outbox with re-arm (admin), DICOM peers, the model lifecycle (lifecycle.js).
import { api, can } from './api.js'
import { confirmDialog, deployDialog, installDialog, readLifecycle, renderLifecycle } from './lifecycle.js'
import { h, iso, num, toast, when } from './util.js'

const CLASSES = ['URGENT', 'INPATIENT', 'OUTPATIENT']
const COLOURS = { URGENT: '#ff5c5c', INPATIENT: '#f5b942', OUTPATIENT: '#4fb3ff' }
const SVG = 'http://www.w3.org/2000/svg'

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag)
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v))
  el.append(...children)
  return el
}

// a small line chart of series {name: [[t, y]...]}: the lines in an inline SVG that
// stretches to its box, the labels in HTML (SVG text would stretch with it)
export function lineChart(title, series, unit = '') {
  const W = 600, H = 180, P = 2
  const points = Object.values(series).flat()
  const box = h('div', { class: 'chart card' }, h('h3', {}, title))
  if (!points.length) {
    box.append(h('p', { class: 'muted' }, 'no samples yet (one every 5 s while the server runs)'))
    return box
  }
  const t0 = Math.min(...points.map((p) => p[0]))
  const t1 = Math.max(...points.map((p) => p[0]), t0 + 1)
  const ymax = Math.max(1e-9, ...points.map((p) => p[1])) * 1.1
  const x = (t) => P + ((t - t0) / (t1 - t0)) * (W - 2 * P)
  const y = (v) => H - P - (v / ymax) * (H - 2 * P)
  const chart = svg('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': title })
  chart.append(svg('line', { x1: 0, y1: H - P, x2: W, y2: H - P, class: 'axis', 'vector-effect': 'non-scaling-stroke' }))
  for (const [name, pts] of Object.entries(series)) {
    if (!pts.length) continue
    const d = pts.map((p, i) => `${i ? 'L' : 'M'}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' ')
    chart.append(svg('path', { d, fill: 'none', stroke: COLOURS[name] || '#9ad', 'stroke-width': 2, 'vector-effect': 'non-scaling-stroke' }))
  }
  const time = (t) => new Date(t * 1000).toLocaleTimeString(undefined, { hour12: false })
  box.append(
    h('div', { class: 'chart-y' }, `max ${num(ymax / 1.1, ymax < 10 ? 2 : 0)}${unit}`),
    chart,
    h('div', { class: 'chart-x' }, h('span', {}, time(t0)), h('span', {}, time(t1))),
    h('div', { class: 'legend' }, Object.keys(series).map((n) => h('span', {}, h('i', { style: `background:${COLOURS[n] || '#9ad'}` }), n))),
  )
  return box
}

export function opsPage(root) {
  const section = h('section', { class: 'page ops' }, h('h1', {}, 'Operations'))
  const figures = h('div', { class: 'ops-grid', id: 'ops-figures' })
  const outbox = h('div', { class: 'card wide', id: 'outbox' })
  const peers = h('div', { class: 'card', id: 'peers' })
  const models = h('div', { class: 'card wide', id: 'lifecycle' })
  // one column on a laptop; on a wall screen the figures beside models, outbox and peers
  section.append(h('div', { class: 'ops-layout' }, h('div', { class: 'ops-main' }, figures), h('div', { class: 'ops-side' }, models, outbox, peers)))
  root.replaceChildren(section)
  let timer = null
  let closed = false
  const confirm = confirmDialog(() => refresh())
  const deploy = deployDialog(() => refresh())
  const install = installDialog(() => refresh())

  // background: the timer's refresh (no activity of the person; see api())
  async function refresh(background = false) {
    try {
      const [data, lifecycle] = await Promise.all([api('/console/api/ops', { background }), readLifecycle(background)])
      if (closed) return
      renderFigures(data)
      renderPeers(data)
      renderLifecycle(models, lifecycle, confirm.ask, deploy.ask, install.ask)
      if (data.now.open_models.length) models.append(h('p', { class: 'bad' }, 'circuit breaker open: ', data.now.open_models.map((m, i) => [i ? ', ' : '', iso(m)])))
      if (can('admin')) await renderOutbox(background)
      else outbox.replaceChildren(h('h2', {}, 'Outbox'), h('p', { class: 'muted' }, 'The outbox is shown to admin sessions.'))
    } catch (error) {
      toast(`operations: ${error.message}`, 'error')
    }
  }

  function series(history, field, keys) {
    const out = {}
    for (const key of keys) out[key] = history.filter((p) => p[field] && p[field][key] !== undefined).map((p) => [p.at, p[field][key]])
    return out
  }

  function renderFigures(data) {
    const { now, history } = data
    const devices = Object.keys(now.device_utilization)
    const models = Object.keys(now.batch_mean)
    const cards = CLASSES.map((c) =>
      h(
        'div',
        { class: `card stat cls-border-${c}`, 'data-class': c },
        h('h3', {}, c),
        h('div', { class: 'big' }, String(now.queue_depth[c] ?? 0)),
        h('div', {}, `waiting · ${now.running[c] ?? 0} running`),
        h('div', {}, `mean TAT ${now.tat_mean[c] !== undefined ? `${num(now.tat_mean[c])} s` : '—'} (${now.tat_count[c] ?? 0} jobs)`),
        h('div', { class: (now.deadline_misses[c] ?? 0) > 0 ? 'bad' : '' }, `deadline misses ${now.deadline_misses[c] ?? 0}`),
      ),
    )
    figures.replaceChildren(
      ...cards,
      lineChart('Queue depth per class', series(history, 'queue_depth', CLASSES)),
      lineChart('Turnaround per class (mean of jobs finished in each 5 s)', series(history, 'tat_mean', CLASSES), ' s'),
      lineChart('Device utilisation', series(history, 'device_utilization', devices)),
      lineChart('Mean batch size per model', series(history, 'batch_mean', models)),
      h('div', { class: 'card' }, h('h3', {}, 'Devices now'), h('table', {}, h('tbody', {}, devices.map((d) => h('tr', {}, h('td', {}, d), h('td', { class: 'n' }, `${num(100 * now.device_utilization[d], 0)} %`), h('td', { class: 'n' }, now.device_memory_total[d] ? `${num(now.device_memory_used[d] / 2 ** 30, 1)} / ${num(now.device_memory_total[d] / 2 ** 30, 1)} GiB` : '')))))),
      h('div', { class: 'card' }, h('h3', {}, 'Batches'), h('table', {}, h('tbody', {}, models.length ? models.map((m) => h('tr', {}, h('td', {}, m), h('td', { class: 'n' }, `mean ${num(now.batch_mean[m], 2)}`), h('td', { class: 'n' }, `${now.batch_count[m]} calls`))) : h('tr', {}, h('td', {}, 'no batches yet'))))),
    )
  }

  const rearmed = new Map() // id -> attempts when re-armed: no second click until it tried again
  async function rearm(item) {
    rearmed.set(item.id, item.attempts)
    try {
      await api(`/v1/ops/outbox/${item.id}/retry`, { method: 'POST' })
      toast(`delivery ${item.id} re-armed`)
      await renderOutbox()
    } catch (error) {
      toast(`re-arm refused: ${error.message}`, 'error')
    }
  }

  async function renderOutbox(background = false) {
    const data = await api('/v1/ops/outbox?limit=200', { background })
    if (closed) return
    const destinations = data.destinations.map((d) =>
      h('tr', { class: d.failing_since ? 'failing' : '' }, h('td', {}, d.kind), h('td', {}, d.destination), h('td', { class: 'n' }, d.pending), h('td', { class: 'n' }, d.retrying), h('td', { class: 'n' }, d.failed_permanent), h('td', {}, when(d.failing_since)), h('td', { class: 'err' }, d.last_error || '')),
    )
    const items = data.items
      .filter((i) => i.state !== 'sent' || i.attempts > 1)
      .map((i) =>
        h(
          'tr',
          { 'data-outbox': i.id, 'data-state': i.state, class: `ob-${i.state}${i.last_error && i.state !== 'sent' ? ' ob-error' : ''}` },
          h('td', {}, i.id),
          h('td', {}, i.kind),
          h('td', {}, i.destination),
          h('td', { class: 'state' }, i.state),
          h('td', { class: 'n' }, i.attempts),
          h('td', {}, when(i.next_attempt_at)),
          h('td', { class: 'err' }, i.last_error || ''),
          h('td', {}, rearmed.get(i.id) === i.attempts ? 're-armed' : i.state === 'failed_permanent' || i.state === 'committing' || (i.state === 'pending' && i.attempts > 0) ? h('button', { 'data-action': 'rearm', onclick: () => rearm(i) }, 'Re-arm') : ''),
        ),
      )
    outbox.replaceChildren(
      h('h2', {}, 'Outbox'),
      h('table', { class: 'destinations' }, h('thead', {}, h('tr', {}, ['kind', 'destination', 'pending', 'retrying', 'failed', 'failing since', 'last error'].map((t) => h('th', {}, t)))), h('tbody', {}, destinations.length ? destinations : h('tr', {}, h('td', { colspan: 7 }, 'no deliveries')))),
      h('h3', {}, 'Deliveries not yet sent (and sent after retries)'),
      // its own scroll box: a long outage must not push the other panels off a wall screen
      h('div', { class: 'scroll short' }, h('table', { class: 'items', id: 'outbox-items' }, h('thead', {}, h('tr', {}, ['id', 'kind', 'destination', 'state', 'attempts', 'next attempt', 'last error', ''].map((t) => h('th', {}, t)))), h('tbody', {}, items.length ? items : h('tr', {}, h('td', { colspan: 8 }, 'nothing waiting'))))),
    )
  }

  function renderPeers(data) {
    const g = data.gateway
    peers.replaceChildren(
      h('h2', {}, 'DICOM peers'),
      h('p', {}, g.enabled ? `SCP ${g.ae_title}${g.address ? ` on ${g.address.join(':')}` : ''}` : 'DICOM gateway off'),
      h('table', { id: 'peer-table' }, h('thead', {}, h('tr', {}, ['AE title', 'host', 'port', 'last delivery', 'failing since', 'waiting', 'last error'].map((t) => h('th', {}, t)))), h('tbody', {}, data.peers.map((p) => h('tr', { class: p.failing_since ? 'failing' : '' }, h('td', {}, p.ae_title), h('td', {}, p.host), h('td', {}, p.port ?? '—'), h('td', {}, when(p.last_delivery)), h('td', {}, when(p.failing_since)), h('td', { class: 'n' }, p.pending), h('td', { class: 'err' }, p.last_error || ''))))),
    )
  }

  refresh()
  timer = setInterval(() => refresh(true), 5000)
  return () => {
    closed = true
    clearInterval(timer)
    confirm.remove()
    deploy.remove()
    install.remove()
  }
}
