// The study view: NiiVue slice viewer (the analysed series + label maps), findings,
// organ volumes, stage timings, downloads and the job's audit trail.
import { Niivue, SLICE_TYPE } from '@niivue/niivue'
import { api } from './api.js'
import { clip, h, inert, iso, num, toast, when } from './util.js'

// CT windows (level, width in HU)
export const WINDOWS = {
  'soft tissue': [40, 400],
  lung: [-600, 1500],
  bone: [400, 1800],
}

// Other modalities have no fixed scale (MR in arbitrary units, a PET in Bq/ml): one
// window, the image's own robust range (NiiVue's 2-98th percentile at load). A CT window
// on a PET showed every voxel with activity as white.
function analysedModality(report) {
  const selected = report.series_selection && report.series_selection.selected
  return (selected && selected.modality) || 'CT'
}

function windowsFor(modality) {
  return modality === 'CT' ? WINDOWS : { auto: null }
}

function labelLut(segments, shown) {
  // NiiVue label colour table: index = label value; alpha 0 hides a label
  const top = Math.max(0, ...segments.map((s) => s.value))
  const lut = { R: [], G: [], B: [], A: [], I: [], labels: [] }
  for (let v = 0; v <= top; v++) {
    const seg = segments.find((s) => s.value === v)
    const [r, g, b] = seg ? seg.color || [255, 255, 0] : [0, 0, 0]
    lut.R.push(r)
    lut.G.push(g)
    lut.B.push(b)
    lut.A.push(seg && shown.has(v) ? 255 : 0)
    lut.I.push(v)
    lut.labels.push(seg ? seg.label : '')
  }
  return lut
}

export function studyPage(root, jobId) {
  let nv = null
  let closed = false
  const section = h('section', { class: 'page study' }, h('p', {}, 'loading…'))
  root.replaceChildren(section)

  load().catch((error) => {
    if (!closed) section.replaceChildren(h('p', { class: 'error' }, `cannot show this job: ${error.message}`))
  })

  async function load() {
    const data = await api(`/console/api/jobs/${encodeURIComponent(jobId)}`)
    if (closed) return
    const { job, report, files, trail, refused } = data
    const header = h(
      'div',
      { class: 'study-head' },
      h('a', { href: '#/' }, '← worklist'),
      h('h1', { title: `Job ${job.accession || job.id}` }, 'Job ', clip(job.accession || job.id)),
      h('span', { class: `badge state-${job.state}` }, job.state),
      h('span', { class: `cls cls-${job.priority_class}` }, job.priority_class),
      h('span', {}, `${job.pipeline} ${job.pipeline_version}`),
    )
    const patient = h('div', { class: 'patient', id: 'patient' })
    if (data.phi_allowed) {
      api(`/console/api/jobs/${encodeURIComponent(jobId)}/patient`)
        .then((p) => patient.replaceChildren(...[['Patient', p.name], ['ID', p.patient_id], ['Born', p.birth_date], ['Sex', p.sex]].map(([what, value]) => h('span', { class: 'field' }, `${what}: `, clip(value || '—')))))
        .catch((e) => patient.replaceChildren(h('span', {}, `patient details unavailable: ${e.message}`)))
    } else {
      patient.replaceChildren(h('span', { class: 'muted' }, 'Patient details hidden for this role'))
    }
    section.replaceChildren(header, patient)
    if (!report) {
      section.append(h('p', {}, job.error ? `${job.error.code}: ${job.error.message}` : `No result yet (${job.state}).`))
      // failed because its pipeline refused every series: which, and why, as for a result
      if (refused && refused.length) section.append(refusedSeries(refused, `Not analysed: none of the ${refused.length} series in this study met the pipeline's rules`))
      section.append(trailTable(trail))
      return
    }
    const canvas = h('canvas', { id: 'viewer', width: 800, height: 800 })
    const viewer = h('div', { class: 'viewer-box' }, canvas)
    const controls = h('div', { class: 'controls', id: 'viewer-controls' })
    const sliceLabel = h('span', { id: 'slice-label' }, '')
    const slider = h('input', { type: 'range', min: 0, max: report.geometry.shape[0] - 1, value: 0, id: 'slice', 'aria-label': 'slice' })
    const left = h('div', { class: 'viewer-col' }, viewer, h('div', { class: 'slicebar' }, slider, sliceLabel), controls)
    const right = h('div', { class: 'info-col' })
    const rejected = (report.series_selection && report.series_selection.rejected) || []
    if (rejected.length) section.append(refusedSeries(rejected, `Not analysed: ${rejected.length} other series in this study`))
    section.append(h('div', { class: 'study-grid' }, left, right))

    right.append(findingsTable(report, (finding) => goToSlice(finding.key_slice_index, finding)))
    right.append(organTable(report))
    right.append(timingsTable(report, job))
    right.append(downloads(jobId, report, files, data.phi_downloads))
    section.append(trailTable(trail))

    nv = new Niivue({
      backColor: [0, 0, 0, 1],
      show3Dcrosshair: false,
      crosshairColor: [0.2, 0.8, 1, 0.35],
      isColorbar: false,
      dragAndDropEnabled: false,
      // NiiVue's own font has no '…' glyph (each draw warned in the console)
      loadingText: 'loading image...',
      textHeight: 0.03,
    })
    await nv.attachToCanvas(canvas)
    nv.setSliceType(SLICE_TYPE.AXIAL)
    const maps = report.outputs.label_maps
    const volumes = [{ url: `/v1/jobs/${encodeURIComponent(jobId)}/volume`, name: 'ct.nii.gz', colormap: 'gray' }]
    for (const map of maps) {
      volumes.push({ url: `/v1/jobs/${encodeURIComponent(jobId)}/labels?kind=${map.kind}`, name: `${map.kind}.nii.gz`, opacity: 0.5 })
    }
    await nv.loadVolumes(volumes)
    if (closed) return
    const shown = maps.map((m) => new Set(m.segments.map((s) => s.value)))
    maps.forEach((map, i) => {
      nv.volumes[i + 1].setColormapLabel(labelLut(map.segments, shown[i]))
    })
    const modality = analysedModality(report)
    const windows = windowsFor(modality)
    canvas.dataset.modality = modality
    setWindow(Object.keys(windows)[0])
    nv.updateGLVolume()

    const nz = report.geometry.shape[0]
    const current = () => Math.round(nv.frac2vox(nv.scene.crosshairPos)[2])
    const showSlice = () => {
      const k = current()
      slider.value = String(k)
      sliceLabel.textContent = `slice ${k + 1} / ${nz}`
      canvas.dataset.slice = String(k)
    }
    nv.onLocationChange = showSlice
    function goToSlice(k, finding) {
      const [i, j] = finding ? [finding.centroid_voxel[2], finding.centroid_voxel[1]] : nv.frac2vox(nv.scene.crosshairPos)
      nv.scene.crosshairPos = nv.vox2frac([i, j, k])
      nv.drawScene()
      showSlice()
    }
    slider.addEventListener('input', () => goToSlice(Number(slider.value)))
    const first = report.findings[0]
    goToSlice(first ? first.key_slice_index : Math.floor(nz / 2), first)

    function setWindow(name) {
      const image = nv.volumes[0]
      if (windows[name]) {
        const [level, width] = windows[name]
        image.cal_min = level - width / 2
        image.cal_max = level + width / 2
      } else {
        image.cal_min = image.robust_min
        image.cal_max = image.robust_max
      }
      nv.updateGLVolume()
      canvas.dataset.window = name
      for (const b of controls.querySelectorAll('[data-window]')) b.classList.toggle('active', b.dataset.window === name)
    }
    controls.append(h('span', { class: 'group' }, 'Window ', Object.keys(windows).map((name) => h('button', { 'data-window': name, onclick: () => setWindow(name) }, name))))
    maps.forEach((map, i) => {
      const index = i + 1
      const opacity = h('input', { type: 'range', min: 0, max: 100, value: 50, 'data-opacity': map.kind, 'aria-label': `${map.kind} opacity` })
      opacity.addEventListener('input', () => nv.setOpacity(index, Number(opacity.value) / 100))
      const all = h('input', { type: 'checkbox', checked: true, 'data-overlay': map.kind })
      all.addEventListener('change', () => {
        nv.setOpacity(index, all.checked ? Number(opacity.value) / 100 : 0)
      })
      const labels = map.segments.map((seg) => {
        const box = h('input', { type: 'checkbox', checked: true, 'data-label': `${map.kind}:${seg.label}` })
        box.addEventListener('change', () => {
          if (box.checked) shown[i].add(seg.value)
          else shown[i].delete(seg.value)
          nv.volumes[index].setColormapLabel(labelLut(map.segments, shown[i]))
          nv.updateGLVolume()
        })
        const [r, g, b] = seg.color || [255, 255, 0]
        return h('label', { class: 'seg' }, box, h('span', { class: 'swatch', style: `background: rgb(${r},${g},${b})` }), iso(seg.label))
      })
      controls.append(h('div', { class: 'group overlay' }, h('label', {}, all, ` ${map.kind}`), ' opacity ', opacity, labels))
    })
    window.__radserveViewer = { nv, current, goToSlice, setWindow }
  }

  return () => {
    closed = true
    if (nv && nv.gl) {
      const lose = nv.gl.getExtension('WEBGL_lose_context')
      if (lose) lose.loseContext()
    }
    delete window.__radserveViewer
  }
}

function findingsTable(report, onPick) {
  // A finding cut by the edge of the volume (coverage 'partial', report schema 2.3): its
  // diameters and volume are lower bounds, shown '≥ ' as a partial organ's volume is.
  const rows = report.findings.map((f) => {
    const cut = f.coverage === 'partial'
    const least = cut ? '≥ ' : ''
    const title = cut ? `truncated by the edge of the scanned volume: ${f.edges.join(', ').replaceAll('_', ' ')}` : undefined
    return h(
      'tr',
      { class: 'finding', 'data-finding': f.finding_id, 'data-slice': f.key_slice_index, 'data-coverage': f.coverage || 'complete', title, tabindex: 0, onclick: () => onPick(f), onkeydown: (e) => e.key === 'Enter' && onPick(f) },
      h('td', {}, f.finding_id),
      h('td', {}, f.label),
      h('td', {}, f.containing_organ || '—'),
      h('td', { class: 'n' }, least + num(f.longest_diameter_mm)),
      h('td', { class: 'n' }, least + num(f.short_axis_mm)),
      h('td', { class: 'n' }, least + num(f.volume_ml, 2)),
      h('td', { class: 'n' }, num(f.mean_hu, 0)),
      h('td', { class: 'n' }, f.key_slice_index + 1),
    )
  })
  return h(
    'div',
    { class: 'card' },
    h('h2', {}, `Findings (${report.findings.length})`),
    h('table', { id: 'findings' }, h('thead', {}, h('tr', {}, ['#', 'finding', 'organ', 'long mm', 'short mm', 'ml', 'mean HU', 'slice'].map((t) => h('th', {}, t)))), h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: 8 }, 'no findings')))),
  )
}

function refusedSeries(rejected, heading) {
  // The series of the study that the pipeline did not run on, with the selection rule
  // each broke and its instance count (report.series_selection.rejected, or for a job
  // that failed because all were refused, the console's reading of them): above the
  // viewer, so nobody takes a study for fully analysed when only one of its series was.
  // No series description (free text may hold names).
  const rows = rejected.map((s) =>
    h(
      'tr',
      { 'data-series': s.series_instance_uid, title: `Series Instance UID ${s.series_instance_uid}` },
      h('td', { class: 'n' }, s.series_number ?? '—'),
      h('td', {}, clip(s.modality || '—')),
      h('td', { class: 'n' }, s.instance_count ?? '—'),
      h('td', { class: 'reason' }, s.reason || 'no reason given'),
    ),
  )
  return h(
    'div',
    { class: 'card refused', id: 'refused' },
    h('h2', {}, heading),
    h('table', { id: 'refused-series' }, h('thead', {}, h('tr', {}, ['series', 'modality', 'instances', 'why not analysed'].map((t) => h('th', {}, t)))), h('tbody', {}, rows)),
  )
}

function organTable(report) {
  return h(
    'div',
    { class: 'card' },
    h('h2', {}, 'Organs'),
    h('table', { id: 'organs' }, h('thead', {}, h('tr', {}, ['organ', 'ml', 'mean HU', 'coverage'].map((t) => h('th', {}, t)))), h('tbody', {}, (report.organ_measurements || []).map((o) => h('tr', {}, h('td', {}, o.label), h('td', { class: 'n' }, o.volume_ml === null ? 'not assessed' : `${o.coverage === 'partial' ? '≥ ' : ''}${num(o.volume_ml)}`), h('td', { class: 'n' }, num(o.mean_hu, 0)), h('td', {}, o.coverage || '—'))))),
  )
}

function timingsTable(report, job) {
  const timings = report.timings || job.stage_timings || {}
  // a routine study's stage that waited while URGENT work ran says how long it waited
  const paused = report.paused || {}
  const row = ([k, v]) => h('tr', { 'data-stage': k }, h('td', {}, k), h('td', { class: 'n' }, `${num(v, 3)} s`), h('td', { class: 'muted paused' }, paused[k] ? `${num(paused[k], 2)} s paused for URGENT` : ''))
  return h('div', { class: 'card' }, h('h2', {}, 'Stage timings'), h('table', { id: 'timings' }, h('tbody', {}, Object.entries(timings).map(row))))
}

// phi: whether this session may download what names the patient (the FHIR Bundle's
// Patient, the SEG's and SR's patient module; console.phi_roles): else not offered
function downloads(jobId, report, files, phi) {
  const id = encodeURIComponent(jobId)
  const links = [
    ['Report (JSON)', `/v1/jobs/${id}/report`],
    ...(phi ? [['FHIR Bundle', `/v1/jobs/${id}/fhir`]] : []),
    ...report.outputs.label_maps.map((m) => [`NIfTI ${m.kind}`, `/v1/jobs/${id}/labels?kind=${m.kind}`]),
    [`${analysedModality(report)} volume (NIfTI)`, `/v1/jobs/${id}/volume`],
    ...(phi ? files.filter((f) => f.endsWith('.dcm')) : []).map((f) => [`${f.includes('-sr') ? 'SR' : 'SEG'}: ${f}`, `/console/api/jobs/${id}/files/${encodeURIComponent(f)}`]),
  ]
  return h('div', { class: 'card' }, h('h2', {}, 'Downloads'), h('ul', { class: 'downloads', id: 'downloads' }, links.map(([label, href]) => h('li', {}, h('a', { href, download: '' }, label)))))
}

function trailTable(trail) {
  return h(
    'div',
    { class: 'card wide', id: 'trail-card' },
    h('h2', {}, 'Audit trail'),
    h('table', { id: 'trail' }, h('thead', {}, h('tr', {}, ['seq', 'time', 'action', 'key', 'client', 'details'].map((t) => h('th', {}, t)))), h('tbody', {}, trail.map((r) => h('tr', {}, h('td', {}, r.seq), h('td', {}, when(r.ts)), h('td', {}, r.action), h('td', { class: 'actor' }, r.actor_hidden ? h('span', { class: 'muted', title: 'a key or user this session may not see (security.visibility)' }, 'not shown') : clip(r.actor_key_id || '—')), h('td', {}, r.actor_hidden ? '' : clip(r.client || '—')), h('td', { class: 'details' }, inert(JSON.stringify(r.payload).slice(0, 160))))))),
  )
}

export { toast }
