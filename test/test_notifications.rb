# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "strobe/notifications"

# ActiveSupport notifications as markers (issue 19), with the real
# activesupport gem (rake deps installs it apart from the suite's gems, so
# each test runs its program in a child process that has it).
class TestNotifications < Minitest::Test
  def run_app(code)
    out, err, status = run_ruby(<<~RUBY, env: app_gems_env, timeout: 120)
      require "strobe"
      require "strobe/notifications"
      require "active_support"
      require "active_support/notifications"
      require "json"
      def spin(s); d = Process.clock_gettime(Process::CLOCK_MONOTONIC) + s; nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) < d; end
      #{code}
    RUBY
    assert status.success?, "stderr: #{err[0, 800]}"
    JSON.parse(out, symbolize_names: true)
  end

  def test_events_of_the_chosen_sets_become_markers_of_their_thread
    markers = run_app(<<~RUBY)
      sub = Strobe::Notifications.subscribe(:sql, :controller, "deliver.action_mailer")
      result = Strobe.run(mode: :wall, interval: 1000, raw: true) do
        ActiveSupport::Notifications.instrument("process_action.action_controller",
            controller: "PostsController", action: "index", method: "GET", path: "/posts", status: 200,
            params: { "secret" => "x" }, headers: Object.new) do |payload|
          ActiveSupport::Notifications.instrument("sql.active_record", name: "Post Load",
              sql: "SELECT * FROM posts", binds: [1]) { spin(0.01) }
          ActiveSupport::Notifications.instrument("sql.active_record", name: "Post Load", sql: "SELECT 1", cached: true) { }
          payload[:view_runtime] = 1.5
        end
        ActiveSupport::Notifications.instrument("deliver.action_mailer", mailer: "Mailer", to: ["a@b"], perform_deliveries: true) { }
        ActiveSupport::Notifications.instrument("render_template.action_view", identifier: "/app/views/x.erb") { }
      end
      sub.unsubscribe
      after = Strobe.run(mode: :wall, interval: 1000) { ActiveSupport::Notifications.instrument("sql.active_record", sql: "SELECT 2") { spin(0.005) } }
      puts JSON.generate(result[:markers].reject { |m| %i[gc gvl thread].include?(m[:type]) } + (after[:markers] || []).reject { |m| %i[gc gvl thread].include?(m[:type]) } +
                         [{ main: result[:threads].find { |_, t| t[:main] }.first }])
    RUBY
    main = markers.pop[:main]
    assert_equal %w[process_action.action_controller sql.active_record sql.active_record deliver.action_mailer],
                 markers.map { |m| m[:type] }, "in order of start, none after unsubscribing, none of a set not chosen"
    action, query, cached, mail = markers
    assert_equal "PostsController#index", action[:name]
    assert_equal({ controller: "PostsController", action: "index", method: "GET", path: "/posts", status: 200, view_runtime: 1.5 },
                 action[:data], "the payload as it was when the event finished; no params or headers")
    assert_equal ["Post Load", { sql: "SELECT * FROM posts" }], [query[:name], query[:data]], "no binds"
    assert_equal({ sql: "SELECT ?", cached: true }, cached[:data], "literals as ?")
    assert_operator query[:end] - query[:start], :>=, 10_000
    assert_operator action[:start], :<=, query[:start]
    assert_operator action[:end], :>=, cached[:end]
    assert_equal [main] * 4, markers.map { |m| m[:thread] }
    assert_equal ["deliver.action_mailer", { mailer: "Mailer", perform_deliveries: true }], [mail[:name], mail[:data]],
                 "another event: its plain values"
  end

  def test_long_sql_is_cut_and_events_elsewhere_are_not_kept
    markers = run_app(<<~RUBY)
      Strobe::Notifications.subscribe(true)
      other = Thread.new { sleep 0.05; ActiveSupport::Notifications.instrument("sql.active_record", sql: "SELECT other") { } }
      result = Strobe.run(mode: :wall, interval: 1000, threads: [Thread.current]) do
        ActiveSupport::Notifications.instrument("cache_read.active_support", key: ["posts", 1], hit: true) { }
        ActiveSupport::Notifications.instrument("sql.active_record", sql: "SELECT " + "column_name, " * 500 + "x FROM t") { }
        ActiveSupport::Notifications.instrument("render_partial.action_view", identifier: "/app/views/posts/_post.html.erb",
                                                count: 3, locals: { secret: 1 }) { }
        other.join
      end
      puts JSON.generate(result[:markers].reject { |m| %i[gc gvl thread].include?(m[:type]) })
    RUBY
    cache, sql, partial = markers
    assert_equal 3, markers.size, "not the thread that is not profiled"
    assert_equal ["_post.html.erb", { identifier: "/app/views/posts/_post.html.erb", count: 3 }], [partial[:name], partial[:data]]
    assert_equal ["read posts/1", { key: "posts/1", hit: true }], [cache[:name], cache[:data]]
    assert_equal Strobe::Notifications::TEXT_LIMIT + 1, sql[:data][:sql].length
    assert sql[:data][:sql].end_with?("…")
  end

  # Under the middleware: the request's profile holds its SQL beside the
  # request marker; a middleware that profiles nothing subscribes to nothing.
  def test_the_middleware_records_the_sets_it_is_given
    markers = run_app(<<~RUBY)
      require "rack"
      require "strobe/middleware"
      app = lambda do |_env|
        ActiveSupport::Notifications.instrument("sql.active_record", name: "Post Load", sql: "SELECT * FROM posts") { spin(0.01) }
        [200, {}, ["ok"]]
      end
      results = Queue.new
      mw = Strobe::Middleware.new(app, enabled: true, notifications: [:sql], save_every: 1, save_at_exit: false,
                                       on_result: ->(r) { results << r })
      idle = Strobe::Middleware.new(app, notifications: [:sql])
      idle.call(Rack::MockRequest.env_for("/posts"))
      mw.call(Rack::MockRequest.env_for("/posts"))
      listeners = ActiveSupport::Notifications.notifier.listeners_for("sql.active_record").size
      puts JSON.generate(results.pop[:markers].reject { |m| %i[gc gvl thread].include?(m[:type]) }.map { |m| m.slice(:type, :name) } + [listeners])
    RUBY
    assert_equal 1, markers.pop, "one subscription: the middleware that profiles"
    assert_equal [{ type: "request", name: "GET /posts" }, { type: "sql.active_record", name: "Post Load" }],
                 markers.sort_by { |m| m[:type] }
  end

  # What could hold people's data stays out: SQL literals (an adapter that
  # inlines values), another event's texts; an odd event name still makes a
  # marker that a profile file keeps; two subscriptions record once.
  def test_values_stay_out_and_subscriptions_are_shared
    out = run_app(<<~RUBY)
      require "tmpdir"
      first = Strobe::Notifications.subscribe(:sql, "Billing.charge", "deliver.action_mailer")
      second = Strobe::Notifications.subscribe(:sql)
      result = Strobe.run(mode: :wall, interval: 1000, raw: true) do
        ActiveSupport::Notifications.instrument("sql.active_record", name: "User Create",
            sql: "INSERT INTO users (email, password_digest, age) VALUES ('bob@example.com', '$2a$12$abc', 42)") { }
        ActiveSupport::Notifications.instrument("Billing.charge", amount: 12.5, card: "4111 1111 1111 1111") { }
        ActiveSupport::Notifications.instrument("deliver.action_mailer", mailer: "UserMailer", mail: "To: bob@example.com\n...",
                                                to: ["bob@example.com"], perform_deliveries: true) { }
        second.unsubscribe
        ActiveSupport::Notifications.instrument("sql.active_record", sql: "SELECT 1") { }
        first.unsubscribe
        ActiveSupport::Notifications.instrument("sql.active_record", sql: "SELECT 2") { }
      end
      loaded = Dir.mktmpdir do |dir|
        Strobe.save(result, File.join(dir, "p.json"))
        Strobe.load(File.join(dir, "p.json"))
      end
      puts JSON.generate(loaded[:markers].reject { |m| %i[gc gvl thread].include?(m[:type]) }.map { |m| m.slice(:type, :name, :data) })
    RUBY
    assert_equal [
      { type: "sql.active_record", name: "User Create", data: { sql: "INSERT INTO users (email, password_digest, age) VALUES (?, ?, ?)" } },
      { type: "billing.charge", name: "Billing.charge", data: { amount: 12.5 } },
      { type: "deliver.action_mailer", name: "deliver.action_mailer", data: { mailer: "UserMailer", perform_deliveries: true } },
      { type: "sql.active_record", name: "SQL", data: { sql: "SELECT ?" } },
    ], out, "once each while subscribed twice, then once, then not at all"
  end

  # Literals go whichever way the database quotes them (test_sql_shape has
  # the rest): where a backslash may or may not escape a quote, the shape
  # hides all that either reading takes for a literal.
  def test_sql_keeps_its_shape_only
    {
      %q{SELECT * FROM t WHERE path = 'C:\' AND token = 's3cr3t'} => "SELECT * FROM t WHERE path = ?",
      %q{SELECT 'it\'s' FROM t WHERE a = .5} => "SELECT ?",
      %q{SELECT a FROM t WHERE a = .5 AND b = 0xDEAD AND c = $$x$$ AND d = $q$y$q$ AND t1.c = $1} =>
        "SELECT a FROM t WHERE a = ? AND b = ? AND c = ? AND d = ? AND t1.c = $1",
      %q{SELECT "posts"."id" FROM "posts" WHERE "posts"."id" = 42 AND x = 'a''b' LIMIT 10} =>
        %q{SELECT ?.? FROM ? WHERE ?.? = ? AND x = ? LIMIT ?},
    }.each { |sql, shape| assert_equal shape, Strobe::Notifications.sql_shape(sql), sql }
    assert_nil Strobe::Notifications.sql_shape(nil)
  end

  # What an adapter answers of itself (Active Record's adapter_name).
  Adapter = Struct.new(:adapter_name)

  # The payload's :connection names its dialect: "..." are names in
  # PostgreSQL's and SQLite's, strings in MySQL's, and hidden when no
  # adapter says (test_rails.rb sees a real SQLite adapter's).
  def test_sql_is_read_in_its_connections_dialect
    sql = %q{SELECT "posts"."id" FROM "posts" WHERE "posts"."title" = "hunter2" AND id = 42}
    {
      Adapter.new("PostgreSQL") => %q{SELECT "posts"."id" FROM "posts" WHERE "posts"."title" = "hunter2" AND id = ?},
      Adapter.new("SQLite") => %q{SELECT "posts"."id" FROM "posts" WHERE "posts"."title" = "hunter2" AND id = ?},
      Adapter.new("Mysql2") => "SELECT ?.? FROM ? WHERE ?.? = ? AND id = ?",
      Adapter.new("SQLServer") => "SELECT ?.? FROM ? WHERE ?.? = ? AND id = ?",
      Object.new => "SELECT ?.? FROM ? WHERE ?.? = ? AND id = ?",
    }.each do |connection, shape|
      _, data = Strobe::Notifications.describe("sql.active_record", { sql: sql, connection: connection })
      assert_equal shape, data[:sql], connection.inspect
    end
  end

  def test_sets_are_checked
    assert_equal %w[sql.active_record my.event], Strobe::Notifications.events_of([:sql, "my.event", :sql])
    assert_equal Strobe::Notifications::SETS.values.flatten, Strobe::Notifications.events_of([true])
    error = assert_raises(ArgumentError) { Strobe::Notifications.events_of([:sqll]) }
    assert_match(/unknown notifications set: :sqll/, error.message)
    assert_raises(ArgumentError) { Strobe::Notifications.events_of([]) }
    assert_raises(ArgumentError) { Strobe::Notifications.events_of([42]) }
    require "strobe/middleware"
    error = assert_raises(ArgumentError) { Strobe::Middleware.new(->(_) {}, notifications: [:views, :nope]) }
    assert_match(/:nope/, error.message)
  end
end
