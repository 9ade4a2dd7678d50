-- What cli/tests/editor.rs does in Neovim, after the configuration from docs/EDITORS.md: with
-- main.mgn open, wait for the client, then ask what a user asks and write what came back, as
-- JSON, to $MGN_EDITOR_RESULT. The Rust test judges it; this script only records. Every wait
-- is bounded, and the editor quits whatever happens.

local got = {}
local WAIT = 10000

local function lines(buf)
  return vim.api.nvim_buf_get_lines(buf or 0, 0, -1, false)
end

-- The 0-based line and column of the first `needle` in the current buffer.
local function find(needle)
  for i, l in ipairs(lines()) do
    local c = l:find(needle, 1, true)
    if c then
      return i - 1, c - 1
    end
  end
  error('not in the buffer: ' .. needle)
end

local function cursor_to(needle, delta)
  local l, c = find(needle)
  vim.api.nvim_win_set_cursor(0, { l + 1, c + (delta or 0) })
  return { line = l, character = c + (delta or 0) }
end

local function request(method, needle, delta)
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(0) },
    position = cursor_to(needle, delta),
  }
  local answers = vim.lsp.buf_request_sync(0, method, params, WAIT) or {}
  for _, a in pairs(answers) do
    return a.result, a.err or a.error
  end
end

local function session()
  local main = vim.api.nvim_get_current_buf()
  got.filetype = vim.bo.filetype
  local clients = vim.lsp.get_clients or vim.lsp.get_active_clients
  got.attached = vim.wait(WAIT, function()
    return #clients({ bufnr = main }) > 0 and clients({ bufnr = main })[1].initialized
  end, 10)
  if not got.attached then
    return
  end
  got.server = clients({ bufnr = main })[1].name
  got.omnifunc = vim.bo.omnifunc
  got.tagfunc = vim.bo.tagfunc

  -- Completion inside a `use` list, asked before any diagnostics came.
  local items = request('textDocument/completion', 'Linear}', 0) or {}
  got.use_completion = {}
  for _, i in ipairs(items.items or items) do
    table.insert(got.use_completion, i.label)
  end

  local hover = request('textDocument/hover', 'let h', 4)
  got.hover = hover and hover.contents and hover.contents.value

  -- Definition the way a user asks for it: the cursor jumps into the stdlib's copy.
  cursor_to('Linear(d', 0)
  vim.lsp.buf.definition()
  vim.wait(WAIT, function()
    return vim.api.nvim_buf_get_name(0):match('nn%.mgn$') ~= nil
  end, 10)
  got.definition = { file = vim.api.nvim_buf_get_name(0), line = vim.api.nvim_win_get_cursor(0)[1] }
  got.definition.text = vim.api.nvim_get_current_line()
  -- The stdlib file attaches to the server already running (not to a second one, which would
  -- know nothing of main.mgn), so hover there shows the shapes main.mgn gave `Linear`.
  local std = vim.api.nvim_get_current_buf()
  vim.wait(WAIT, function()
    return #clients({ bufnr = std }) > 0
  end, 10)
  got.mgn_clients = #clients({ name = 'mgn' })
  local std_client = clients({ bufnr = std })[1]
  got.stdlib_same_client = std_client ~= nil and std_client.id == clients({ bufnr = main })[1].id
  if std_client then
    local h = request('textDocument/hover', 'let y', 4)
    got.stdlib_hover = h and h.contents and h.contents.value
  end
  vim.api.nvim_set_current_buf(main)

  if vim.lsp.semantic_tokens and vim.lsp.semantic_tokens.get_at_pos then
    local l, c = find('relu')
    vim.wait(WAIT, function()
      local t = vim.lsp.semantic_tokens.get_at_pos(main, l, c)
      return t ~= nil and #t > 0
    end, 10)
    local t = vim.lsp.semantic_tokens.get_at_pos(main, l, c) or {}
    got.semantic_token = t[1] and t[1].type
  end
  if vim.lsp.inlay_hint and vim.lsp.inlay_hint.get then
    got.inlay_hints_enabled = vim.lsp.inlay_hint.is_enabled({ bufnr = main })
  end

  -- Rename a let, then a layer defined in the imported file (which Neovim opens to edit).
  cursor_to('let h', 4)
  vim.lsp.buf.rename('hidden')
  vim.wait(WAIT, function()
    return table.concat(lines(main), '\n'):find('scale(hidden)', 1, true) ~= nil
  end, 10)
  cursor_to('Scale(16)', 0)
  vim.lsp.buf.rename('Gain')
  local blocks = vim.fn.bufnr('blocks.mgn')
  vim.wait(WAIT, function()
    blocks = vim.fn.bufnr('blocks.mgn')
    return blocks > 0 and table.concat(lines(blocks), '\n'):find('layer Gain', 1, true) ~= nil
  end, 10)
  got.renamed = lines(main)
  got.renamed_import = blocks > 0 and lines(blocks) or {}

  vim.lsp.buf.format({ async = false, timeout_ms = WAIT })
  got.formatted = lines(main)

  -- A file with a mistake: its diagnostic arrives by itself.
  vim.cmd('edit bad.mgn')
  local bad = vim.api.nvim_get_current_buf()
  vim.wait(WAIT, function()
    return #vim.diagnostic.get(bad) > 0
  end, 10)
  got.diagnostics = {}
  for _, d in ipairs(vim.diagnostic.get(bad)) do
    table.insert(got.diagnostics, { line = d.lnum, message = d.message, code = d.code })
  end
  got.virtual_text = vim.diagnostic.config().virtual_text and true or false

  -- A typo's quick fix, applied as a user does (`gra` on 0.11 calls this).
  vim.cmd('edit typo.mgn')
  local typo = vim.api.nvim_get_current_buf()
  vim.wait(WAIT, function()
    return #vim.diagnostic.get(typo) > 0
  end, 10)
  cursor_to('rleu', 0)
  vim.lsp.buf.code_action({
    apply = true,
    filter = function(a)
      return a.title == 'replace with `relu`'
    end,
  })
  vim.wait(WAIT, function()
    return table.concat(lines(typo), '\n'):find('relu(x)', 1, true) ~= nil
  end, 10)
  got.quick_fixed = lines(typo)
end

local ok, err = pcall(session)
if not ok then
  got.error = tostring(err)
end
vim.fn.writefile({ vim.json.encode(got) }, os.getenv('MGN_EDITOR_RESULT'))
vim.cmd('qa!')
