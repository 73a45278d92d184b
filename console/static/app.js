// The console works without this file; it only adds conveniences.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // Show times in the reader's own zone as a tooltip.
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
