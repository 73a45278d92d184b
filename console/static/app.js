// The console works without this file; it only adds conveniences.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // Times are written in UTC; add the reader's own time beside each one
  // (time.at) or to its tooltip.
  const local = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
  });
  document.querySelectorAll("time[datetime]").forEach(function (el) {
    const at = new Date(el.getAttribute("datetime"));
    if (isNaN(at)) {
      return;
    }
    const mine = local.format(at);
    const utc = el.classList.contains("at") ? el.textContent : el.title;
    el.title = utc + "\nyour time: " + mine;
    if (el.classList.contains("at")) {
      const label = document.createElement("span");
      label.className = "local";
      label.textContent = " · " + mine;
      el.after(label);
    }
  });
  document.querySelectorAll("code.mono").forEach(function (el) {
    el.title = "click to select";
    el.addEventListener("click", function () {
      const range = document.createRange();
      range.selectNodeContents(el);
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
    });
  });
  // A form whose confirmation box is ticked cannot be sent twice by a
  // double click.
  document.querySelectorAll("form.action").forEach(function (form) {
    form.addEventListener("submit", function () {
      form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    });
  });
});
