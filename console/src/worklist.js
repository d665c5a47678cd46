// The worklist: one list read, then live changes from server-sent events.
import { api, can } from './api.js'
import { clip, duration, h, isoText, toast } from './util.js'

const STATES = ['received', 'queued', 'running', 'succeeded', 'failed', 'cancelled']
const CLASSES = ['URGENT', 'INPATIENT', 'OUTPATIENT']
const FINAL = new Set(['succeeded', 'failed', 'cancelled'])

// deadline risk: share of the turnaround target still left
export function risk(job, now = Date.now()) {
  const deadline = Date.parse(job.deadline)
  // a failed or cancelled job met nothing: it has no result ('none') unless it missed
  if (FINAL.has(job.state)) return job.deadline_missed ? 'missed' : job.state === 'succeeded' ? 'met' : 'none'
  const total = deadline - Date.parse(job.arrival)
  const left = deadline - now
  if (left <= 0) return 'late'
  if (total <= 0 || left / total < 0.25) return 'high'
  if (left / total < 0.5) return 'medium'
  return 'low'
}

// the ETA's band against the deadline: late (even the expected finish is after it),
// risk (the pessimistic end is after it, or the server raised a deadline risk), ok
export function etaRisk(job) {
  const eta = job.eta
  if (!eta || FINAL.has(job.state)) return null
  const deadline = Date.parse(job.deadline)
  if (Date.parse(eta.predicted_finish) > deadline) return 'late'
  if (eta.deadline_risk || Date.parse(eta.predicted_finish_late) > deadline) return 'risk'
  return 'ok'
}

const hhmm = (iso) => new Date(iso).toLocaleTimeString(undefined, { hour12: false })

// what an unfinished job waits for (the server's `waiting_for`: none of its work can run
// on this server now, so it has no ETA), in words for the imaging-IT engineer; the
// server's message, what ends the block, is the cell's tooltip
const WAITS = {
  no_device_worker: 'no device worker',
  lease_unproven: 'database (job leases not renewed)',
  schema_not_current: 'database upgraded by a newer radserve',
}
export const waitingText = (wait) => `waiting: ${WAITS[wait.reason] || String(wait.reason).replaceAll('_', ' ')}`

// a reload the event stream asks for (reset) reads at most this many pages
const RELOAD_PAGES = 50

// whether job a comes before (is newer than) job b in the server's order: arrival, id
const newer = (a, b) => {
  const ta = Date.parse(a.arrival)
  const tb = Date.parse(b.arrival)
  return ta > tb || (ta === tb && a.id > b.id)
}

export function worklistPage(root) {
  const filters = { state: '', cls: '', from: '', to: '', accession: '' }
  const rows = new Map()
  let source = null
  let ticker = null
  let loading = 0
  let stopped = false
  // the server answers a page at a time: `next` fetches the older jobs that match too
  let next = null
  // the last job of the last page read (null: every page was read): a reload the event
  // stream asks for reads down to it, keeping what the user loaded with "Load older jobs"
  let edge = null

  const tbody = h('tbody')
  const count = h('span', { class: 'count' })
  const more = h('button', { type: 'button', class: 'more', id: 'load-more', onclick: () => loadMore() }, 'Load older jobs')
  const partial = h('p', { class: 'partial', id: 'worklist-partial', hidden: true }, h('span', {}), ' ', more)
  const field = (name, el) => {
    el.addEventListener('change', () => {
      filters[name] = el.value
      load()
    })
    return el
  }
  const search = h('input', {
    type: 'search',
    placeholder: 'accession',
    'aria-label': 'search by accession',
    id: 'f-accession',
  })
  let debounce = null
  search.addEventListener('input', () => {
    clearTimeout(debounce)
    debounce = setTimeout(() => {
      filters.accession = search.value.trim()
      load()
    }, 250)
  })
  const bar = h(
    'div',
    { class: 'filters' },
    h('label', {}, 'Class ', field('cls', h('select', { id: 'f-class' }, h('option', { value: '' }, 'all'), CLASSES.map((c) => h('option', { value: c }, c))))),
    h('label', {}, 'State ', field('state', h('select', { id: 'f-state' }, h('option', { value: '' }, 'all'), STATES.map((s) => h('option', { value: s }, s))))),
    h('label', {}, 'From ', field('from', h('input', { type: 'date', id: 'f-from' }))),
    h('label', {}, 'To ', field('to', h('input', { type: 'date', id: 'f-to' }))),
    h('label', {}, 'Search ', search),
    count,
    h('span', { class: 'live', id: 'live' }, '● live'),
  )
  const table = h(
    'table',
    { class: 'worklist', id: 'worklist' },
    h('thead', {}, h('tr', {}, ['Class', 'Accession', 'State', 'Queue', 'Deadline', 'Time left', 'ETA', 'Stage', 'Age', 'Pipeline', ''].map((t) => h('th', {}, t)))),
    tbody,
  )
  root.replaceChildren(h('section', { class: 'page' }, h('h1', {}, 'Worklist'), bar, h('div', { class: 'scroll' }, table, partial)))

  function matches(job) {
    if (filters.state && job.state !== filters.state) return false
    if (filters.cls && job.priority_class !== filters.cls) return false
    if (filters.accession && !(job.accession || '').toLowerCase().includes(filters.accession.toLowerCase())) return false
    const day = job.arrival.slice(0, 10)
    if (filters.from && day < filters.from) return false
    if (filters.to && day > filters.to) return false
    return true
  }

  async function cancel(job) {
    if (!confirm(`Cancel job ${isoText(job.accession || job.id)}?`)) return
    try {
      const out = await api(`/v1/jobs/${encodeURIComponent(job.id)}`, { method: 'DELETE' })
      upsert({ ...job, state: out.state })
      toast('cancel requested')
    } catch (error) {
      toast(`cancel refused: ${error.message}`, 'error')
    }
  }

  async function reprioritise(job, select) {
    const cls = select.value
    select.value = ''
    if (!cls || cls === job.priority_class) return
    if (!confirm(`File ${isoText(job.accession || job.id)} as ${cls}? Its deadline becomes arrival + the ${cls} turnaround target.`)) return
    try {
      const out = await api(`/v1/jobs/${encodeURIComponent(job.id)}/priority`, { method: 'POST', body: { priority_class: cls } })
      upsert({ ...job, priority_class: out.priority_class, deadline: out.deadline, queue_position: out.queue_position })
      toast([clip(job.accession || job.id), `: now ${out.priority_class}`])
    } catch (error) {
      toast(`re-prioritise refused: ${error.message}`, 'error')
    }
  }

  function etaCell(job) {
    const wait = FINAL.has(job.state) ? null : job.waiting_for
    if (wait) {
      return h(
        'td',
        { class: 'eta', 'data-waiting': wait.reason, title: `${wait.message} (since ${hhmm(wait.since)})` },
        h('span', { class: 'waiting' }, waitingText(wait)),
      )
    }
    const band = etaRisk(job)
    if (!band) return h('td', { class: 'eta' }, '—')
    const eta = job.eta
    const spread = Math.max(0, (Date.parse(eta.predicted_finish_late) - Date.parse(eta.predicted_finish)) / 1000)
    return h(
      'td',
      { class: 'eta', 'data-eta': band, title: `predicted finish ${hhmm(eta.predicted_finish)}, pessimistic ${hhmm(eta.predicted_finish_late)} (${eta.basis})` },
      h('span', { class: `risk eta-${band}` }, hhmm(eta.predicted_finish)),
      spread >= 1 ? h('span', { class: 'band' }, ` +${duration(spread)}`) : '',
    )
  }

  function cells(tr, job, now) {
    const left = (Date.parse(job.deadline) - now) / 1000
    const level = risk(job, now)
    tr.className = `state-${job.state} risk-${level}`
    tr.dataset.state = job.state
    tr.dataset.risk = level
    // the actions cell is kept while the job's state and class stay (an open class
    // menu must survive the once-a-second refresh)
    const key = `${job.state}|${job.priority_class}`
    let actions = tr._actions
    if (!actions || tr._actionsKey !== key) {
      actions = h('td', { class: 'actions' })
      if (can('submit') && job.state === 'queued') {
        const select = h('select', { class: 'reprioritise', 'data-action': 'reprioritise', 'aria-label': 'change priority class', title: 'change priority class', onclick: (e) => e.stopPropagation(), onkeydown: (e) => e.stopPropagation() }, h('option', { value: '' }, 'Class…'), CLASSES.filter((c) => c !== job.priority_class).map((c) => h('option', { value: c }, c)))
        select.addEventListener('change', () => reprioritise(job, select))
        actions.append(select, ' ')
      }
      if (can('submit') && !FINAL.has(job.state)) {
        actions.append(h('button', { class: 'cancel', 'data-action': 'cancel', onclick: (e) => { e.stopPropagation(); cancel(job) } }, 'Cancel'))
      }
      tr._actions = actions
      tr._actionsKey = key
    }
    const tds = [
      h('td', {}, h('span', { class: `cls cls-${job.priority_class}` }, job.priority_class)),
      h('td', { class: 'accession' }, clip(job.accession || '—')),
      h('td', { class: 'state' }, job.state),
      h('td', {}, job.queue_position === null || job.queue_position === undefined ? '—' : `#${job.queue_position + 1}`),
      h('td', {}, new Date(job.deadline).toLocaleTimeString(undefined, { hour12: false })),
      h('td', { class: 'left' }, h('span', { class: `risk risk-${level}` }, FINAL.has(job.state) ? { met: 'met', missed: 'missed', none: 'no result' }[level] : duration(left))),
      etaCell(job),
      h('td', {}, job.stage),
      h('td', {}, duration((now - Date.parse(job.arrival)) / 1000)),
      h('td', {}, job.pipeline),
    ]
    if (tr.lastChild === actions) {
      while (tr.firstChild !== actions) tr.firstChild.remove()
      actions.before(...tds)
    } else tr.replaceChildren(...tds, actions)
  }

  function render() {
    const now = Date.now()
    const jobs = [...rows.values()].sort((a, b) => b.arrival.localeCompare(a.arrival) || b.id.localeCompare(a.id))
    const existing = new Map([...tbody.children].map((tr) => [tr.dataset.id, tr]))
    const ordered = jobs.map((job) => {
      let tr = existing.get(job.id)
      if (!tr) {
        tr = h('tr', { dataset: { id: job.id }, tabindex: 0 })
        tr.addEventListener('click', () => (location.hash = `#/job/${encodeURIComponent(job.id)}`))
        tr.addEventListener('keydown', (e) => e.key === 'Enter' && (location.hash = `#/job/${encodeURIComponent(job.id)}`))
      }
      cells(tr, job, now)
      return tr
    })
    const same = ordered.length === tbody.children.length && ordered.every((tr, i) => tbody.children[i] === tr)
    if (!same) tbody.replaceChildren(...ordered)
    count.textContent = next ? `newest ${jobs.length} jobs shown; older ones at the end of the list` : `${jobs.length} job${jobs.length === 1 ? '' : 's'}`
    partial.hidden = !next
    partial.firstChild.textContent = `Showing the newest ${jobs.length} jobs; older ones exist.`
  }

  function upsert(job) {
    if (matches(job)) rows.set(job.id, { ...rows.get(job.id), ...job })
    else rows.delete(job.id)
    render()
  }

  function listen(seq) {
    if (source) source.close()
    source = new EventSource(`/console/api/events?since=${seq}`)
    const live = document.getElementById('live')
    source.addEventListener('open', () => live && (live.className = 'live on'))
    source.addEventListener('error', () => live && (live.className = 'live off'))
    source.addEventListener('job', (e) => upsert(JSON.parse(e.data)))
    source.addEventListener('positions', (e) => {
      const positions = JSON.parse(e.data)
      for (const job of rows.values()) {
        job.queue_position = job.state === 'queued' || job.state === 'received' ? (positions[job.id] ?? null) : null
      }
      render()
    })
    source.addEventListener('etas', (e) => {
      const etas = JSON.parse(e.data)
      for (const job of rows.values()) if (job.id in etas) job.eta = etas[job.id]
      render()
    })
    // what blocks all work of the server now (null: nothing), for every unfinished job
    source.addEventListener('waiting', (e) => {
      const wait = JSON.parse(e.data)
      for (const job of rows.values()) if (!FINAL.has(job.state)) job.waiting_for = wait
      render()
    })
    source.addEventListener('reset', () => load(true)) // asked by the stream, not a person
  }

  function query(cursor) {
    const params = new URLSearchParams()
    if (filters.state) params.append('state', filters.state)
    if (filters.cls) params.append('priority_class', filters.cls)
    if (filters.from) params.set('date_from', filters.from)
    if (filters.to) params.set('date_to', filters.to)
    if (filters.accession) params.set('accession', filters.accession)
    if (cursor) params.set('cursor', cursor)
    return `/console/api/worklist?${params}`
  }

  // the next page of older jobs, added below (a filter change meanwhile drops it)
  async function loadMore() {
    if (!next) return
    const mine = loading
    more.disabled = true
    try {
      const data = await api(query(next))
      if (mine !== loading || stopped) return
      for (const job of data.items) if (!rows.has(job.id)) rows.set(job.id, job)
      next = data.next
      edge = next ? data.items[data.items.length - 1] : null
      render()
    } catch (error) {
      if (!stopped) toast(`worklist: ${error.message}`, 'error')
    } finally {
      more.disabled = false
    }
  }

  // `background`: the event stream asked for it (reset: changes were lost, or the server
  // restarted). That reload reads the pages down to the last one the user had loaded
  // (before, only the first: the older pages loaded with "Load older jobs" vanished);
  // a person's filter change starts again from the first page.
  async function load(background = false) {
    const mine = ++loading
    const deep = background && rows.size > 0
    const until = edge
    try {
      const data = await api(query(null), { background })
      const items = [...data.items]
      let last = data
      for (let pages = 1; deep && last.next && pages < RELOAD_PAGES; pages += 1) {
        if (until && !newer(items[items.length - 1], until)) break
        if (mine !== loading || stopped) return
        last = await api(query(last.next), { background })
        items.push(...last.items)
      }
      if (mine !== loading || stopped) return // a newer load, or the page was left
      rows.clear()
      for (const job of items) rows.set(job.id, job)
      next = last.next
      edge = next ? items[items.length - 1] : null
      render()
      listen(data.seq) // the first page's number: changes since then come again
    } catch (error) {
      if (!stopped) toast(`worklist: ${error.message}`, 'error')
    }
  }

  load()
  ticker = setInterval(render, 1000) // time left and age; no request
  return () => {
    stopped = true // a load still in flight opens no event feed after this
    clearInterval(ticker)
    if (source) source.close()
  }
}
