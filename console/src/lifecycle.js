// Model lifecycle on the operations page: every installed version of every model with its
// deployment (stable, canary with its share, shadow), precision gate, comparison record
// and drift state, and the installs whose variants are built after their request (queued,
// building, how each ended), read from the lifecycle API (GET /v1/models,
// /v1/models/deployments, /v1/models/drift, /v1/models/installs). Install (a bundle zip,
// optionally with its precision variants built and gated after the answer), deploy (a
// version as canary with its share, shadow or stable), promote and rollback are offered
// to admin sessions only, after a form or confirmation (deploy, promote and rollback ask
// for the reason the server audits); the server refuses them to other roles anyway (403).
import { api, can } from './api.js'
import { h, iso, num, toast, when } from './util.js'

export const GUARDRAIL_ACTOR = 'radserve-guardrail'

export async function readLifecycle(background = false) {
  const [models, history, drift, installs] = await Promise.all([
    api('/v1/models', { background }),
    api('/v1/models/deployments', { background }),
    api('/v1/models/drift', { background }),
    api('/v1/models/installs', { background }),
  ])
  return { ...models, history, drift, installs }
}

function installOutcome(t) {
  if (t.result) {
    const gates = Object.entries(t.result.variants || {}).map(([p, g]) => `${p} ${g.accepted ? 'accepted' : 'rejected'}`)
    return [`${t.result.name} ${t.result.version}`, ...gates].join(' · ')
  }
  return t.error ? t.error.message : t.state === 'building' ? `building since ${when(t.started)}` : 'waiting for the build before it'
}

// The installs that build precision variants after their request was answered: the ones
// not finished, and those that ended in the last day (a refused build says why).
function renderInstalls(installs) {
  const day = Date.now() - 24 * 3600 * 1000
  const shown = (installs || []).filter((t) => !t.finished || Date.parse(t.finished) > day)
  if (!shown.length) return []
  return [
    h('h3', {}, 'Installs with variant builds'),
    h(
      'table',
      { class: 'installs', id: 'installs' },
      h('thead', {}, h('tr', {}, ['bundle', 'state', 'received', 'outcome'].map((t) => h('th', {}, t)))),
      h(
        'tbody',
        {},
        shown.map((t) =>
          h(
            'tr',
            { 'data-install': t.id, 'data-state': t.state },
            h('td', {}, iso(t.source)),
            h('td', { class: `install-${t.state}` }, t.state, t.attempts > 1 ? h('div', { class: 'muted attempts' }, `built again after a stop (attempt ${t.attempts})`) : ''),
            h('td', {}, when(t.created)),
            h('td', { class: t.error ? 'err' : '' }, iso(installOutcome(t))),
          ),
        ),
      ),
    ),
  ]
}

function deployedText(v) {
  return v.deployed.map((role) => {
    if (role === 'canary' && v.canary_percent !== null) return `canary ${num(v.canary_percent, 0)} %`
    if (role === 'shadow' && v.shadow_percent !== null) return `shadow ${num(v.shadow_percent, 0)} %`
    return role
  })
}

function gateCell(v) {
  if (v.error) return h('td', { class: 'err' }, v.error)
  const entries = Object.entries(v.gate || {})
  const rejected = entries.filter(([, why]) => why !== 'accepted')
  return h(
    'td',
    { class: 'gate' },
    h('span', { class: 'ok' }, entries.filter(([, why]) => why === 'accepted').map(([p]) => p).join(', ') || 'none accepted'),
    // One line per precision that may not serve; the gate's reason (which can run to a
    // paragraph: a CPU it was not gated on, a failed stratum) opens on a click.
    rejected.map(([p, why]) =>
      h('details', { class: 'err rejected', 'data-precision': p }, h('summary', { title: why }, `${p} not servable here`), h('div', {}, why)),
    ),
  )
}

function recordCell(record) {
  if (!record || (!record.finished && !record.comparisons)) return h('td', { class: 'muted' }, '—')
  const parts = [`${record.finished} job${record.finished === 1 ? '' : 's'}, ${record.failed} failed`]
  if (record.comparisons) {
    parts.push(`${record.comparisons} comparison${record.comparisons === 1 ? '' : 's'}`)
    if (record.lesion_agreement !== null && record.lesion_agreement !== undefined) parts.push(`lesion agreement ${num(record.lesion_agreement, 2)}`)
    if (record.mean_dice !== null && record.mean_dice !== undefined) parts.push(`Dice ${num(record.mean_dice, 3)}`)
    if (record.answer_agreement !== null && record.answer_agreement !== undefined) parts.push(`answers alike ${num(100 * record.answer_agreement, 0)} %`)
    if (record.mean_latency_diff_seconds !== null && record.mean_latency_diff_seconds !== undefined) parts.push(`${record.mean_latency_diff_seconds >= 0 ? '+' : ''}${num(record.mean_latency_diff_seconds, 1)} s`)
  }
  return h('td', { class: 'record' }, parts.join(' · '))
}

function driftCell(monitor) {
  if (!monitor) return h('td', { class: 'muted' }, 'no studies yet')
  if (monitor.collecting_reference) {
    return h('td', { class: 'drift drift-collecting', 'data-drift': 'collecting' }, `collecting reference (${monitor.reference.studies} studies)`)
  }
  const worst = Object.entries(monitor.features || {}).filter(([, f]) => f.state && f.state !== 'ok')
  return h(
    'td',
    { class: `drift drift-${monitor.state}`, 'data-drift': monitor.state },
    h('span', { class: 'badge' }, monitor.state),
    ` ${monitor.window.studies}/${monitor.window.size} in window`,
    worst.length ? h('div', { class: 'muted' }, worst.map(([n, f], i) => [i ? ', ' : '', iso(n), `: ${f.state}`])) : '',
  )
}

// the step's latest guardrail verdict: an automatic rollback, or a live canary not rolled back
function verdict(step, deployment, history) {
  const auto = history.find((d) => d.step === step && d.action === 'auto_rollback')
  const lines = []
  if (deployment && deployment.canary) lines.push(h('div', { class: 'ok', 'data-verdict': 'live' }, `canary ${deployment.canary} live, not rolled back by the guardrails`))
  if (auto) lines.push(h('div', { class: 'bad', 'data-verdict': 'rolled-back' }, `guardrails rolled back automatically ${when(auto.created)}: `, iso(auto.reason || '')))
  return lines
}

// Renders into `box`; `confirm(step, action, text)` asks before acting, `deploy(step,
// version, roles)` opens the deploy form for a version, `install()` the install form.
export function renderLifecycle(box, data, confirm, deploy, install) {
  const admin = can('admin')
  const active = Object.fromEntries(data.deployments.map((d) => [d.step, d]))
  const drift = new Map(data.drift.map((m) => [`${m.model} ${m.version}`, m]))
  const names = [...new Set(data.versions.map((v) => v.name))]
  const blocks = names.map((name) => {
    const d = active[name]
    const versions = data.versions.filter((v) => v.name === name)
    const steps = data.history.filter((x) => x.step === name)
    const last = steps[0]
    const earlier = d && steps.some((x) => x.stable !== d.stable)
    const actions = []
    if (admin && d && d.canary) {
      actions.push(h('button', { 'data-action': 'promote', onclick: () => confirm(name, 'promote', `Promote ${name} ${d.canary} (canary, ${num(d.canary_percent, 0)} %) to stable for every study?`) }, `Promote ${d.canary}`))
    }
    if (admin && d && (d.canary || earlier)) {
      const target = d.canary ? `drop the canary ${d.canary}; ${d.stable} serves every study` : `return from ${d.stable} to the stable version before it`
      actions.push(h('button', { 'data-action': 'rollback', class: 'danger', onclick: () => confirm(name, 'rollback', `Roll back ${name}: ${target}?`) }, 'Roll back'))
    }
    return h(
      'div',
      { class: 'step', 'data-step': name },
      h(
        'div',
        { class: 'step-head' },
        h('h3', {}, name),
        h('span', { class: 'deployment' }, d ? [`stable ${d.stable}`, d.canary ? ` · canary ${d.canary} ${num(d.canary_percent, 0)} %${d.canary_urgent ? ' (URGENT too)' : ''}` : '', d.shadow ? ` · shadow ${d.shadow} ${num(d.shadow_percent, 0)} %` : ''].join('') : 'pipeline default (no deployment recorded)'),
        h('span', { class: 'actions' }, actions),
      ),
      last ? h('div', { class: 'muted last-change' }, `last change: ${last.action} ${when(last.created)} by `, iso(last.actor || '—'), last.reason ? [' — ', iso(last.reason)] : '') : '',
      verdict(name, d, data.history),
      h(
        'table',
        { class: 'versions' },
        h('thead', {}, h('tr', {}, ['version', 'deployed', 'gate (servable precisions)', 'record (jobs, comparisons)', 'drift', ...(admin ? [''] : [])].map((t) => h('th', {}, t)))),
        h(
          'tbody',
          {},
          versions.map((v) =>
            h(
              'tr',
              { 'data-model': v.name, 'data-version': v.version, 'data-deployed': v.deployed.join(' '), class: v.deployed.length ? 'deployed' : '' },
              h('td', {}, v.version),
              h('td', { class: 'roles' }, deployedText(v).map((t) => h('span', { class: `role role-${t.split(' ')[0]}` }, t))),
              gateCell(v),
              recordCell(v.record),
              driftCell(drift.get(`${v.name} ${v.version}`)),
              admin ? h('td', {}, deployButton(name, v, deploy)) : null,
            ),
          ),
        ),
      ),
    )
  })
  box.replaceChildren(
    h('div', { class: 'step-head' }, h('h2', {}, 'Models'), admin && install ? h('span', { class: 'actions' }, h('button', { 'data-action': 'install', onclick: () => install() }, 'Install a bundle…')) : ''),
    ...(blocks.length ? blocks : [h('p', { class: 'muted' }, 'no models installed')]),
    ...renderInstalls(data.installs),
  )
}

// A version that serves as stable already has nothing to deploy; any other may become
// the canary, the shadow or the stable (the server says why when it refuses: no gate,
// a share out of range, the version another role already holds).
function deployButton(step, v, deploy) {
  if (v.deployed.includes('stable')) return null
  return h('button', { 'data-action': 'deploy', onclick: () => deploy(step, v.version) }, 'Deploy…')
}

// The deploy form, one modal like the confirmation: role, share of studies (canary and
// shadow), URGENT studies too (canary), and the audited reason, then POST
// /v1/models/{step}/deploy.
export function deployDialog(onDone) {
  const text = h('p', { id: 'deploy-text' })
  const role = h('select', { id: 'deploy-role', 'aria-label': 'role' }, ['canary', 'shadow', 'stable'].map((r) => h('option', { value: r }, r)))
  const percent = h('input', { id: 'deploy-percent', type: 'number', min: 1, max: 100, step: 1, required: true, 'aria-label': 'share of studies (%)' })
  const urgent = h('input', { id: 'deploy-urgent', type: 'checkbox' })
  const reason = h('input', { id: 'deploy-reason', type: 'text', maxlength: 1000, required: true, placeholder: 'why (kept in the audit log)', 'aria-label': 'reason' })
  const share = h('label', { id: 'deploy-share' }, 'Share of studies (%) ', percent)
  const urgentLabel = h('label', { id: 'deploy-urgent-label' }, urgent, ' URGENT studies too')
  const error = h('p', { class: 'error', role: 'alert' })
  const ok = h('button', { type: 'submit', 'data-action': 'confirm-deploy' }, 'Deploy')
  const cancel = h('button', { type: 'button', 'data-action': 'cancel-deploy' }, 'Cancel')
  const form = h('form', { method: 'dialog' }, h('h2', {}, 'Deploy'), text, h('label', {}, 'Role ', role), share, urgentLabel, h('label', {}, 'Reason ', reason), error, h('div', { class: 'group' }, ok, cancel))
  const dialog = h('dialog', { id: 'deploy-dialog' }, form)
  document.body.append(dialog)
  let pending = null
  // a stable takes every study: no share; only a canary can take URGENT studies
  function fit() {
    const r = role.value
    percent.disabled = r === 'stable'
    share.hidden = r === 'stable'
    urgent.disabled = r !== 'canary'
    urgentLabel.hidden = r !== 'canary'
    if (r !== 'canary') urgent.checked = false
    if (r === 'shadow' && !percent.value) percent.value = '100'
  }
  role.addEventListener('change', fit)
  cancel.addEventListener('click', () => dialog.close())
  form.addEventListener('submit', async (event) => {
    event.preventDefault()
    if (!pending || !reason.value.trim()) return
    ok.disabled = true
    const { step, version } = pending
    const body = { version, role: role.value, percent: role.value === 'stable' ? 0 : Number(percent.value), include_urgent: urgent.checked, reason: reason.value.trim() }
    try {
      await api(`/v1/models/${encodeURIComponent(step)}/deploy`, { method: 'POST', body })
      toast(`${step}: ${version} deployed as ${body.role}`)
      dialog.close()
      onDone()
    } catch (e) {
      error.textContent = `deploy refused: ${e.message}`
    } finally {
      ok.disabled = false
    }
  })
  return {
    ask(step, version) {
      pending = { step, version }
      text.textContent = `${step} ${version}`
      role.value = 'canary'
      percent.value = '10'
      urgent.checked = false
      reason.value = ''
      error.textContent = ''
      fit()
      dialog.showModal()
      role.focus()
    },
    remove() {
      dialog.remove()
    },
  }
}

// The install form: a bundle zip (model.yaml and its ONNX files), and whether to build and
// gate its precision variants. Without them the server installs before it answers (201);
// with them it checks the bundle, answers 202 and builds after, one install at a time, so
// the installs table below shows it queued, building and how it ended. What refuses a
// bundle (not a zip, a bad model.yaml or ONNX file, a version installed already) is
// answered at once either way and shown here.
export function installDialog(onDone) {
  const file = h('input', { id: 'install-file', type: 'file', accept: '.zip,application/zip', required: true, 'aria-label': 'bundle zip' })
  const variants = h('input', { id: 'install-variants', type: 'checkbox' })
  const precisions = ['fp16', 'int8', 'bf16'].map((p) => h('input', { type: 'checkbox', value: p, 'data-precision': p, 'aria-label': p }))
  const choice = h('fieldset', { id: 'install-precisions' }, h('legend', {}, 'Precisions (none ticked: the server\'s lifecycle.variants)'), precisions.map((box) => h('label', {}, box, ` ${box.value} `)))
  const error = h('p', { class: 'error', role: 'alert' })
  const ok = h('button', { type: 'submit', 'data-action': 'confirm-install' }, 'Install')
  const cancel = h('button', { type: 'button', 'data-action': 'cancel-install' }, 'Cancel')
  const form = h(
    'form',
    { method: 'dialog' },
    h('h2', {}, 'Install a model bundle'),
    h('p', { class: 'muted' }, 'Installing does not deploy: the version serves once deployed.'),
    h('label', {}, 'Bundle (zip) ', file),
    h('label', {}, variants, ' build and gate precision variants (minutes; built after the answer)'),
    choice,
    error,
    h('div', { class: 'group' }, ok, cancel),
  )
  const dialog = h('dialog', { id: 'install-dialog' }, form)
  document.body.append(dialog)
  function fit() {
    choice.hidden = !variants.checked
    for (const box of precisions) box.disabled = !variants.checked
  }
  variants.addEventListener('change', fit)
  cancel.addEventListener('click', () => dialog.close())
  form.addEventListener('submit', async (event) => {
    event.preventDefault()
    const bundle = file.files && file.files[0]
    if (!bundle) return
    ok.disabled = true
    error.textContent = ''
    let path = '/v1/models'
    if (variants.checked) {
      const chosen = precisions.filter((box) => box.checked).map((box) => box.value)
      path += `?build_variants=true${chosen.length ? `&precisions=${chosen.join(',')}` : ''}`
    }
    try {
      const answer = await api(path, { method: 'POST', file: bundle })
      toast(answer.state ? `${bundle.name}: accepted; its variants are built next (installs below)` : `${answer.name} ${answer.version} installed`)
      dialog.close()
      onDone()
    } catch (e) {
      error.textContent = `install refused: ${e.message}`
    } finally {
      ok.disabled = false
    }
  })
  return {
    ask() {
      form.reset()
      error.textContent = ''
      fit()
      dialog.showModal()
      file.focus()
    },
    remove() {
      dialog.remove()
    },
  }
}

// One modal confirmation (outside the refreshed area, so a refresh does not close it):
// the reason is required and audited with the change.
export function confirmDialog(onDone) {
  const text = h('p', { id: 'confirm-text' })
  const reason = h('input', { id: 'confirm-reason', type: 'text', maxlength: 1000, required: true, placeholder: 'why (kept in the audit log)', 'aria-label': 'reason' })
  const error = h('p', { class: 'error', role: 'alert' })
  const ok = h('button', { type: 'submit', 'data-action': 'confirm' }, 'Confirm')
  const cancel = h('button', { type: 'button', 'data-action': 'cancel-confirm' }, 'Cancel')
  const form = h('form', { method: 'dialog' }, h('h2', {}, 'Confirm'), text, h('label', {}, 'Reason ', reason), error, h('div', { class: 'group' }, ok, cancel))
  const dialog = h('dialog', { id: 'confirm-dialog' }, form)
  document.body.append(dialog)
  let pending = null
  cancel.addEventListener('click', () => dialog.close())
  form.addEventListener('submit', async (event) => {
    event.preventDefault()
    if (!pending || !reason.value.trim()) return
    ok.disabled = true
    const { step, action } = pending
    try {
      await api(`/v1/models/${encodeURIComponent(step)}/${action}`, { method: 'POST', body: { reason: reason.value.trim() } })
      toast(`${step}: ${action} done`)
      dialog.close()
      onDone()
    } catch (e) {
      error.textContent = `${action} refused: ${e.message}`
    } finally {
      ok.disabled = false
    }
  })
  return {
    ask(step, action, question) {
      pending = { step, action }
      text.textContent = question
      reason.value = ''
      error.textContent = ''
      dialog.showModal()
      reason.focus()
    },
    remove() {
      dialog.remove()
    },
  }
}
