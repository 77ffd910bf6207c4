// Pretty-prints JSON embedded with Django's json_script into <pre data-json-from="<script id>">.
for (const pre of document.querySelectorAll("pre[data-json-from]")) {
  const source = document.getElementById(pre.dataset.jsonFrom);
  if (source) pre.textContent = JSON.stringify(JSON.parse(source.textContent), null, 2);
}
