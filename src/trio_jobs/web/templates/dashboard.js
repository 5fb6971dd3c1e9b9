(function(){
  document.addEventListener('submit', function(e){
    var f = e.target, q = f.getAttribute && f.getAttribute('data-confirm');
    if (q && !window.confirm(q)) { e.preventDefault(); }
  });
  var box = document.getElementById('live'), on = document.getElementById('live-on');
  if (!box || !on) { return; }
  setInterval(function(){
    var a = document.activeElement;
    if (!on.checked || document.hidden) { return; }
    if (a && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName)) { return; }
    fetch(location.href, {credentials: 'same-origin', headers: {'X-Live': '1'}})
      .then(function(r){ return r.ok ? r.text() : null; })
      .then(function(t){
        if (!t) { return; }
        var doc = new DOMParser().parseFromString(t, 'text/html');
        var fresh = doc.getElementById('live');
        if (fresh) { box.innerHTML = fresh.innerHTML; }
      })
      .catch(function(){});
  }, 5000);
})();
