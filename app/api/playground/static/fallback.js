// A classic (non-module) script: if app.js never starts (a browser without ES modules, a failed
// download), say so instead of leaving a page that waits forever.
window.addEventListener("load", () => {
  window.setTimeout(() => {
    if (document.documentElement.dataset.started === "true") return;
    const box = document.getElementById("message");
    box.textContent =
      "The playground's script did not start (this browser may not support JavaScript modules). " +
      "The JSON API still works: see /docs.";
    box.className = "message error";
    box.hidden = false;
  }, 4000);
});
