# frozen_string_literal: true

# Writes a demo flamegraph HTML from synthetic, deterministic data, for manual
# and headless-browser checks of lib/strobe/flamegraph.html.
#
#   ruby test/flamegraph_fixture.rb OUT.html [N_SAMPLES] [--no-timeline]
#
# N_SAMPLES defaults to 1000; 0 writes an empty profile (only the root). The
# tree is random but seeded: about 30 deep, up to ~5,000 nodes (nodes that get
# no sample are dropped), with a time-ordered, run-length encoded timeline that
# has some locality (consecutive samples tend to share most of their stack).
# This is not a test file itself (not named test_*.rb).

require "json"

TEMPLATE = File.expand_path("../lib/strobe/flamegraph.html", __dir__)
POTENTIAL_NODES = 5000
MAX_DEPTH = 30
GC_NAMES = ["(garbage collection)", "(marking)", "(sweeping)"].freeze

args = ARGV.dup
no_timeline = !args.delete("--no-timeline").nil?
out = args[0] or abort "usage: ruby test/flamegraph_fixture.rb OUT.html [N_SAMPLES] [--no-timeline]"
n_samples = Integer(args[1] || 1000)
abort "N_SAMPLES must be >= 0" if n_samples.negative?

rng = Random.new(20_240_601)

# ---------------------------------------------------------------- frames

names = []
files = []
lines = []
add_frame = lambda do |name, file, line|
  names << name
  files << file
  lines << line
  names.size - 1
end

GC_NAMES.each { |n| add_frame.call(n, "", 0) }
add_frame.call("<main>", "/app/bin/server", 1)
add_frame.call("<top (required)>", "/app/config/boot.rb", 3)
add_frame.call("Template#render </script><b>not bold</b> & \"quoted\"", "/app/lib/template.rb", 42)
add_frame.call("Kernel#require", "<internal:/usr/lib/ruby/3.1.0/rubygems/core_ext/kernel_require.rb>", 85)

modules = %w[App Billing Catalog Auth Search Render Cache DB Http Json Mailer Queue Report Sync]
verbs = %w[call run each map process fetch load save render parse build find update handle
           validate compute dispatch serialize encode decode]
modules.each do |mod|
  rng.rand(4..9).times do |c|
    klass = "#{mod}::#{%w[Controller Service Worker Model Client Store Builder Adapter Query][c % 9]}#{c}"
    path = "/app/lib/#{mod.downcase}/#{klass.split('::').last.downcase}.rb"
    rng.rand(3..8).times do
      verb = verbs[rng.rand(verbs.size)]
      name = rng.rand < 0.15 ? "block in #{klass}##{verb}" : "#{klass}##{verb}"
      add_frame.call(name, path, rng.rand(1..400))
    end
  end
end
ordinary_frames = (3...names.size).to_a

# ---------------------------------------------------------------- potential tree

parent = [-1]
frame = [-1]
depth = [0]
kids = [{}]
add_node = lambda do |p, f|
  existing = kids[p][f]
  return existing if existing

  parent << p
  frame << f
  depth << depth[p] + 1
  kids << {}
  kids[p][f] = parent.size - 1
end

gc = add_node.call(0, 0)
marking = add_node.call(gc, 1)
sweeping = add_node.call(gc, 2)
main = add_node.call(0, 3) # <main>
last = main
while parent.size < POTENTIAL_NODES
  p = rng.rand < 0.8 ? last : rng.rand(main...parent.size)
  p = parent[p] while depth[p] >= MAX_DEPTH
  last = add_node.call(p, ordinary_frames[rng.rand(ordinary_frames.size)])
end
node_count = parent.size

# ---------------------------------------------------------------- samples

# A few hot nodes: weight ~ u^6.
weights = Array.new(node_count) { |i| i.zero? ? 0.0 : rng.rand**6 }
weights[gc] = 0.0 # GC samples sit in (marking) / (sweeping)
weights[marking] = weights[sweeping] = 25.0
cumulative = []
acc = 0.0
weights.each { |w| cumulative << (acc += w) }
pick_weighted = lambda do
  r = rng.rand * acc
  cumulative.bsearch_index { |c| c > r } || (node_count - 1)
end
kid_lists = kids.map(&:values)
next_node = lambda do |cur|
  return pick_weighted.call if rng.rand < 0.3

  n = cur
  rng.rand(4).times { n = parent[n] if n.positive? }
  while (k = kid_lists[n]).any? && rng.rand < 0.6
    n = k[rng.rand(k.size)]
  end
  n.zero? ? pick_weighted.call : n
end

run_node = []
run_count = []
remaining = n_samples
cur = pick_weighted.call
while remaining.positive?
  len = rng.rand < 0.5 ? 1 : rng.rand(1..6)
  len = remaining if len > remaining
  if run_node.last == cur
    run_count[-1] += len
  else
    run_node << cur
    run_count << len
  end
  remaining -= len
  cur = next_node.call(cur)
end

self_count = Array.new(node_count, 0)
run_node.each_with_index { |n, i| self_count[n] += run_count[i] }
total = self_count.dup
(node_count - 1).downto(1) { |i| total[parent[i]] += total[i] }

# Drop the nodes without samples; parents keep smaller indexes than children.
keep = (0...node_count).select { |i| i.zero? || total[i].positive? }
new_index = Array.new(node_count, -1)
keep.each_with_index { |old, i| new_index[old] = i }

data = {
  "meta" => {
    "title" => "Strobe demo: #{n_samples} synthetic samples",
    "mode" => "wall",
    "interval" => 1000,
    "samples" => n_samples,
    "unit" => "samples",
  },
  "frames" => { "name" => names, "file" => files, "line" => lines },
  "tree" => {
    "parent" => keep.map { |old| old.zero? ? -1 : new_index[parent[old]] },
    "frame" => keep.map { |old| frame[old] },
    "self" => keep.map { |old| self_count[old] },
    "total" => keep.map { |old| total[old] },
  },
  "timeline" => if no_timeline || run_node.empty?
                  nil
                else
                  { "node" => run_node.map { |old| new_index[old] }, "count" => run_count }
                end,
}

html_escape = { "&" => "&amp;", "<" => "&lt;", ">" => "&gt;", '"' => "&quot;", "'" => "&#39;" }
template = File.read(TEMPLATE)
html = template.sub("/*STROBE_DATA*/null") { JSON.generate(data).gsub("</", "<\\/") }
html = html.sub("STROBE_TITLE") { data["meta"]["title"].gsub(/[&<>"']/, html_escape) }
File.write(out, html)

tree_depth = keep.map { |old| depth[old] }.max
warn format("wrote %<out>s: %<bytes>d bytes, %<nodes>d nodes, depth %<depth>d, %<runs>d timeline runs",
            out: out, bytes: html.bytesize, nodes: keep.size, depth: tree_depth, runs: run_node.size)
