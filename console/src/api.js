// Calls to radserve with the session cookie; state-changing calls carry the CSRF token.
export const session = { role: null, csrf: null, phi: false, keyName: null, user: null, site: null }
// Which sign-in a request was sent under: a 401 answering a request of an ended session
// (a worklist refresh in flight at sign-out, answered after the next user signed in)
// must not sign out the session that followed it.
let epoch = 0

const RANK = { read: 0, submit: 1, admin: 2 }
export const can = (role) => session.role !== null && RANK[session.role] >= RANK[role]

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message)
    this.status = status
    this.code = code
  }
}

// `body` goes as JSON; `file` (a File or Blob, e.g. a bundle zip) as it is, with its type.
// `background`: the page asks by itself (a timer's refresh, a reload the event stream
// asked for), not a person: the server does not count it as activity, so an unattended
// tab still signs out after console.idle_timeout_s.
export async function api(path, { method = 'GET', body, file, background = false } = {}) {
  const headers = { Accept: 'application/json' }
  if (background) headers['X-Console-Background'] = '1'
  if (method !== 'GET' && session.csrf) headers['X-CSRF-Token'] = session.csrf
  if (body !== undefined) headers['Content-Type'] = 'application/json'
  if (file !== undefined) headers['Content-Type'] = file.type || 'application/octet-stream'
  const sentUnder = epoch
  const response = await fetch(path, {
    method,
    headers,
    credentials: 'same-origin',
    body: file !== undefined ? file : body === undefined ? undefined : JSON.stringify(body),
  })
  if (response.status === 204) return null
  const text = await response.text()
  let data = null
  try {
    data = text ? JSON.parse(text) : null
  } catch {
    data = null
  }
  if (!response.ok) {
    const error = (data && data.error) || {}
    const current = sentUnder === epoch && session.role !== null
    if (response.status === 401 && current && !path.startsWith('/console/api/session')) {
      window.dispatchEvent(new Event('radserve:signedout')) // the session ended
    }
    throw new ApiError(response.status, error.code || 'error', error.message || response.statusText)
  }
  return data
}

export function adopt(info) {
  epoch += 1
  session.role = info.role
  session.csrf = info.csrf
  session.phi = info.phi
  session.keyName = info.key_name
  session.user = info.user || null
  session.site = info.site || null
}

export function forget() {
  epoch += 1
  session.role = null
  session.csrf = null
  session.phi = false
  session.keyName = null
  session.user = null
  session.site = null
}
