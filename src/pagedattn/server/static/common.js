// Shared by the pages: DOM helpers, the API key (kept in sessionStorage for this tab only)
// and the login prompt that stands in for the page until a key the server accepts is given.

const KEY = "pagedattn.apiKey";

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export class AuthError extends Error {}

export async function errorMessage(res) {
  try {
    const body = await res.json();
    return body?.error?.message || `${res.status} ${res.statusText}`;
  } catch {
    return `${res.status} ${res.statusText}`;
  }
}

// fetch with the API key; a 401 throws AuthError (the page shows its login prompt)
export async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  const key = sessionStorage.getItem(KEY);
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const res = await fetch(path, { ...init, headers, cache: "no-store" });
  if (res.status === 401) throw new AuthError(await errorMessage(res));
  return res;
}

// Run start(); until it succeeds without an AuthError only the login prompt shows.
export function boot(start) {
  const app = document.getElementById("app");
  const login = document.getElementById("login");
  const form = document.getElementById("login-form");
  const input = document.getElementById("login-key");
  const problem = document.getElementById("login-error");
  const signOut = document.getElementById("sign-out");
  const attempt = async () => {
    try {
      await start();
      login.hidden = true;
      app.hidden = false;
      signOut.hidden = !sessionStorage.getItem(KEY);
    } catch (err) {
      if (!(err instanceof AuthError)) throw err;
      app.hidden = true;
      login.hidden = false;
      problem.textContent = sessionStorage.getItem(KEY) ? err.message : "";
      input.focus();
    }
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, input.value.trim());
    input.value = "";
    attempt();
  });
  signOut.addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    window.location.reload();
  });
  attempt();
}

export function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let u = 0;
  while (n >= 1024 && u < units.length - 1) { n /= 1024; u += 1; }
  return `${n >= 100 || u === 0 ? Math.round(n) : n.toFixed(1)} ${units[u]}`;
}
