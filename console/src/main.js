// radserve console: sign-in, then hash routes #/ (worklist), #/job/ID, #/ops.
// Job ids only in the URL: never patient data.
import './style.css'
import { adopt, api, forget, session } from './api.js'
import { clip, h, toast } from './util.js'
import { worklistPage } from './worklist.js'
import { studyPage } from './study.js'
import { opsPage } from './ops.js'

const app = document.getElementById('app')
let leave = null

function signInPage() {
  document.getElementById('nav').hidden = true
  document.getElementById('signout').hidden = true
  document.getElementById('who').textContent = ''
  // shown already: kept, with what the user has typed. Two callers at once (a sign-out
  // and the route its hash change ran) built it twice, the second replacing the form the
  // user was filling in, so a click could submit the new, empty one.
  if (document.getElementById('signin')?.isConnected) return
  const key = h('input', { type: 'password', id: 'api-key', autocomplete: 'off', placeholder: 'rsk_…', required: true, 'aria-label': 'API key' })
  const message = h('p', { class: 'error', id: 'signin-error', role: 'alert' })
  const form = h(
    'form',
    { class: 'signin card', id: 'signin' },
    h('h1', {}, 'Sign in'),
    h('p', { class: 'muted' }, 'Use an API key (radserve keys create). The session ends after inactivity or at sign-out.'),
    h('label', {}, 'API key ', key),
    h('button', { type: 'submit' }, 'Sign in'),
    message,
  )
  const signIn = async (body, error, refused) => {
    error.textContent = ''
    try {
      adopt(await api('/console/api/session', { method: 'POST', body }))
      route()
      return true
    } catch (e) {
      error.textContent = e.status === 401 ? refused : `Sign-in failed: ${e.message}`
      return false
    }
  }
  form.addEventListener('submit', async (event) => {
    event.preventDefault()
    if (await signIn({ key: key.value }, message, 'That key is not valid.')) key.value = ''
  })
  app.replaceChildren(form)
  key.focus()
  // local users (console.users): a user name and password form above the key form
  api('/console/api/signin')
    .then(({ methods }) => {
      if (!methods.includes('password') || !form.isConnected) return
      const username = h('input', { type: 'text', id: 'username', autocomplete: 'username', required: true, maxlength: 64, 'aria-label': 'user name' })
      const password = h('input', { type: 'password', id: 'password', autocomplete: 'current-password', required: true, maxlength: 1024, 'aria-label': 'password' })
      const error = h('p', { class: 'error', id: 'signin-user-error', role: 'alert' })
      const userForm = h(
        'form',
        { class: 'signin card', id: 'signin-user' },
        h('h1', {}, 'Sign in'),
        h('label', {}, 'User name ', username),
        h('label', {}, 'Password ', password),
        h('button', { type: 'submit' }, 'Sign in'),
        error,
      )
      userForm.addEventListener('submit', async (event) => {
        event.preventDefault()
        const ok = await signIn({ username: username.value, password: password.value }, error, 'Unknown user name or wrong password.')
        password.value = '' // never kept in the page
        if (ok) username.value = ''
      })
      form.querySelector('h1').textContent = 'or with an API key'
      app.replaceChildren(userForm, form)
      username.focus()
    })
    .catch(() => {}) // an older server: key sign-in only
}

async function ensureSession() {
  if (session.role) return true
  try {
    adopt(await api('/console/api/session'))
    return true
  } catch {
    return false
  }
}

async function route() {
  if (leave) leave()
  leave = null
  if (!(await ensureSession())) return signInPage()
  document.getElementById('nav').hidden = false
  document.getElementById('signout').hidden = false
  // the scope security.visibility gives this session (a key's or a local user's site)
  const scope = session.site ? ` · site ${session.site}` : ''
  const who = document.getElementById('who')
  who.replaceChildren(clip(session.user || session.keyName || 'key'), ` · ${session.role}`, ...(session.site ? [' · site ', clip(session.site)] : []))
  who.title = `${session.user || session.keyName || 'key'} · ${session.role}${scope}`
  const hash = location.hash || '#/'
  const job = hash.match(/^#\/job\/([^/]+)$/)
  for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', (a.dataset.nav === 'ops') === hash.startsWith('#/ops'))
  if (job) leave = studyPage(app, decodeURIComponent(job[1]))
  else if (hash.startsWith('#/ops')) leave = opsPage(app)
  else leave = worklistPage(app)
}

document.getElementById('signout').addEventListener('click', async () => {
  // the page's refreshes and event feed stop first: none is sent while the session ends
  if (leave) leave()
  leave = null
  try {
    await api('/console/api/session', { method: 'DELETE' })
  } catch (error) {
    toast(error.message, 'error')
  }
  forget()
  history.replaceState(null, '', '#/') // no hashchange: route() would build it again
  signInPage()
})

window.addEventListener('radserve:signedout', () => {
  forget()
  if (leave) leave()
  leave = null
  signInPage()
})
window.addEventListener('hashchange', route)
route()
