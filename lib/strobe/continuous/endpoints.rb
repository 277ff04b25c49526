# frozen_string_literal: true

require_relative "../middleware"

module Strobe
  class Continuous
    # Rack middleware that gives continuous profiles their endpoints: each
    # request, while Strobe samples, is marked on its thread's timeline as
    # Strobe::Middleware marks it (the framework's route: Rails'
    # Controller#action, Sinatra's or Grape's route; never a path the
    # client chose: see Middleware.endpoint), and the pprof of each window
    # labels its samples `endpoint` (a filter in Pyroscope's UI). It
    # profiles nothing itself; without a profile running it only calls the
    # application.
    #
    #   Rails.application.config.middleware.insert(0, Strobe::Continuous::Endpoints)
    #   use Strobe::Continuous::Endpoints, endpoint: ->(env) { env["my.route"] }
    #
    # endpoint: a proc given the env once the application answered, that
    # names the endpoint (nil: as by default).
    #
    # A request that spans two windows is marked in the second: the first
    # window's samples of it carry no endpoint.
    class Endpoints
      def initialize(app, endpoint: nil)
        raise ArgumentError, "endpoint must be a proc, got #{endpoint.inspect}" unless endpoint.nil? || endpoint.respond_to?(:call)

        @app = app
        @endpoint = endpoint
        @warned = false
      end

      def call(env)
        since = Native.now_us if Strobe.running?
        response = @app.call(env)
      ensure
        mark(env, since, response) if since
      end

      private

      def mark(env, since, response)
        Middleware.mark_request(env, since, response, @endpoint)
      rescue StandardError => e
        return if @warned

        @warned = true
        Continuous.warn_line($stderr, "could not mark a request: #{e.message}")
      end
    end
  end
end
